"""The chat page end to end in headless Chromium, driven over the DevTools protocol (a small
WebSocket client on the standard library): open the page, give it the API key, ask two questions
greedily and wait for each streamed answer, reload and look at what was kept, take a screenshot,
run the page's Markdown renderer on hostile input, stop an answer, start a new chat. Prints one
JSON object with what the page showed; the Rust test asserts on it.

Usage: chat_page.py <page url> <screenshot path> <chromium binary> <api key>"""

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

url, shot, chromium, key = sys.argv[1:]


class DevTools:
    """One WebSocket to one page target; `call` sends a command and returns its result."""

    def __init__(self, ws_url):
        host_port, path = ws_url[len("ws://"):].split("/", 1)
        host, port = host_port.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert b" 101 " in head.split(b"\r\n")[0], head
        self.next_id = 0

    def _send(self, text):
        data = text.encode()
        mask = os.urandom(4)
        n = len(data)
        header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                                  bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                                  bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError("DevTools closed the connection")
            out += chunk
        return out

    def _recv(self):
        message = b""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            message += self._exact(n)
            if b0 & 0x80:
                return json.loads(message)

    def call(self, method, **params):
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = self._recv()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def js(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")



# Every chat answer's SSE text is also read by the test from a clone of the response, so that
# the context figure the page shows can be compared with the usage the server reported.
TAP = """window.__usage = [];
const pageFetch = window.fetch;
window.fetch = async (resource, options) => {
  const r = await pageFetch(resource, options);
  if (String(resource).includes('/chat/completions')) {
    r.clone().text().then((text) => {
      for (const line of text.split('\\n')) {
        if (!line.startsWith('data: {')) continue;
        const chunk = JSON.parse(line.slice(6));
        if (chunk.usage) window.__usage.push(chunk.usage);
      }
    }).catch(() => {});
  }
  return r;
};"""

LAST = """(() => { const all = document.querySelectorAll('#log .assistant'); const a = all[all.length - 1];
  return {n: all.length, text: a ? a.textContent : '', done: a ? a.dataset.done || null : null,
          errors: [...document.querySelectorAll('#log .error')].map(e => e.textContent)}; })()"""

MESSAGES = "[...document.querySelectorAll('#log .msg')].map(e => [e.className, e.textContent])"

STORAGE = """(() => { const dump = (s) => Object.fromEntries(Object.keys(s).map(k => [k, s.getItem(k)]));
  return {local: dump(localStorage), session: dump(sessionStorage)}; })()"""

HOSTILE = """<img src=x onerror="window.pwned=1">

[x](javascript:alert(1)) and [docs](https://example.com/a?b=1&c=2)

```html
<script>window.pwned=2</script>
```

**<b>bold</b>** and *<i>it</i>* and `<svg onload="window.pwned=3">`

- one <iframe src="javascript:window.pwned=4"></iframe>
- two

1. first

2. second"""

RENDER = """(async (source) => {
  const host = document.createElement('div');
  host.className = 'msg assistant';
  host.append(renderMarkdown(source));
  document.getElementById('log').append(host);
  // Time for an injected element to load or fire its handler.
  await new Promise((resolve) => setTimeout(resolve, 500));
  const texts = (selector) => [...host.querySelectorAll(selector)].map((e) => e.textContent);
  const result = {
    pwned: typeof window.pwned,
    injected: host.querySelectorAll('img, script, svg, iframe, b, i, object, embed').length,
    on_attributes: [...host.querySelectorAll('*')].flatMap((e) => [...e.attributes].map((a) => a.name))
      .filter((name) => name.startsWith('on')),
    text: host.textContent,
    pre_code: texts('pre > code'),
    pre_lang: [...host.querySelectorAll('pre')].map((e) => e.dataset.lang || null),
    links: [...host.querySelectorAll('a')].map((a) => ({href: a.getAttribute('href'), rel: a.rel, target: a.target})),
    strong: texts('strong'), em: texts('em'), inline_code: texts(':not(pre) > code'),
    ul: texts('ul > li'), ol: [...host.querySelectorAll('ol')].map((o) => [...o.children].map((li) => li.textContent)),
    paragraphs: host.querySelectorAll('p').length,
  };
  host.remove();
  return result;
})"""


def wait(what, predicate, secs):
    deadline = time.time() + secs
    while True:
        value = predicate()
        if value:
            return value
        if time.time() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def loaded(page):
    """After a navigation or reload: the page's script has run and it named the model."""
    wait("the page to load", lambda: page.js("document.readyState === 'complete' && !window.__old"), 60)
    wait("the model's name", lambda: page.js("document.getElementById('model').textContent.includes('gguf')"), 60)
    page.js(TAP)


def reload(page):
    page.js("window.__old = true")
    page.call("Page.reload")
    loaded(page)


def ask(page, question, max_tokens):
    """Sends `question` greedily; returns the finished answer's state and whether text showed
    before it was done."""
    before = page.js(LAST)["n"]
    page.js("document.getElementById('temperature').value = '0';"
            f"document.getElementById('max_tokens').value = '{max_tokens}';"
            f"document.getElementById('input').value = {json.dumps(question)};"
            "document.getElementById('send').click();")
    seen_partial = False
    deadline = time.time() + 240
    while True:
        state = page.js(LAST)
        if state["errors"]:
            raise RuntimeError(f"the page shows an error: {state}")
        if state["n"] > before:
            if state["text"] and not state["done"]:
                seen_partial = True
            if state["done"]:
                break
        if time.time() > deadline:
            raise RuntimeError(f"no finished answer to {question!r}: {state}")
        time.sleep(0.05)
    # The usage chunk precedes [DONE]; the tap reads the clone a moment later.
    wait("the tapped usage", lambda: page.js("window.__usage.length > 0"), 10)
    return {"answer": state["text"], "done": state["done"], "seen_partial": seen_partial,
            "context": page.js("document.getElementById('context_text').textContent"),
            "reported_usage": page.js("window.__usage[window.__usage.length - 1]")}


profile = tempfile.mkdtemp(prefix="llm-chromium-")
browser = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                            "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                            "--remote-debugging-port=0", "--window-size=900,700", "about:blank"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
try:
    port_file = os.path.join(profile, "DevToolsActivePort")
    deadline = time.time() + 60
    while not os.path.exists(port_file) or not open(port_file).read().strip():
        if browser.poll() is not None or time.time() > deadline:
            raise RuntimeError("chromium did not start: " + browser.stderr.read().decode(errors="replace")[-2000:])
        time.sleep(0.1)
    port = open(port_file).read().split()[0]
    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
    page = DevTools(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
    page.call("Page.enable")
    page.call("Page.navigate", url=url)
    # Without the key the server refuses the model list, and the page says why.
    result = {"model_without_key": wait("the page to ask for the model", lambda: page.js(
        "document.readyState === 'complete' && !document.getElementById('model').textContent.endsWith('…')"
        " && document.getElementById('model').textContent"), 60)}
    page.js(f"const k = document.getElementById('api_key'); k.value = {json.dumps(key)};"
            "k.dispatchEvent(new Event('change'));")
    loaded(page)
    result["model"] = page.js("document.getElementById('model').textContent")
    result["france"] = ask(page, "Which city is the capital of France?", 64)
    result["speed"] = page.js("document.getElementById('speed').textContent")
    result["send_enabled"] = page.js("!document.getElementById('send').disabled")
    result["code"] = ask(page, "Write a Python function that adds two numbers.", 200)
    result["code"]["pre_code"] = page.js(
        "[...[...document.querySelectorAll('#log .assistant')].pop().querySelectorAll('pre > code')].map(c => c.textContent)")
    result["code"]["inline_code"] = page.js(
        "[...document.querySelectorAll('#log .assistant')].pop().querySelectorAll(':not(pre) > code').length")
    # A reload shows the same conversation. An older page kept the key in localStorage: this
    # one must remove it.
    before = page.js(MESSAGES)
    page.js(f"localStorage.setItem('llm-api-key', {json.dumps(key)})")
    reload(page)
    result["reload"] = {
        "before": before, "after": page.js(MESSAGES), "storage": page.js(STORAGE),
        "context": page.js("document.getElementById('context_text').textContent"),
        "pre_code": page.js("document.querySelectorAll('#log .assistant pre > code').length"),
    }
    png = page.call("Page.captureScreenshot", format="png")["data"]
    with open(shot, "wb") as f:
        f.write(base64.b64decode(png))
    result["render"] = page.js(f"({RENDER})({json.dumps(HOSTILE)})")
    # An unclosed fence (an answer still streaming) is already a code block.
    result["render_unclosed"] = page.js(
        "(() => { const d = document.createElement('div'); d.append(renderMarkdown('Here:\\n```py\\ndef f(<b>')); "
        "return [...d.querySelectorAll('pre > code')].map(c => c.textContent); })()")
    # Quotes nest only so deep: the rest of a line of many '>' is text.
    result["render_deep_quote"] = page.js(
        "(() => { const d = document.createElement('div'); d.append(renderMarkdown('>'.repeat(5000) + ' deep')); "
        "return {quotes: d.querySelectorAll('blockquote').length, text: d.textContent.length}; })()")
    # Stop: a long answer, stopped once it has started, ends at once with what had come.
    n = page.js(LAST)["n"]
    page.js("document.getElementById('max_tokens').value = '400';"
            "document.getElementById('input').value = 'Tell me a long story.';"
            "document.getElementById('send').click();")
    wait("the long answer to start", lambda: (lambda s: s["n"] == n + 1 and s["text"])(page.js(LAST)), 120)
    page.js("document.getElementById('stop').click()")
    stopped_at = time.time()
    wait("stop to end the answer", lambda: page.js(LAST)["done"], 10)
    result["stop"] = {"done": page.js(LAST)["done"], "secs": round(time.time() - stopped_at, 2),
                      "send_enabled": page.js("!document.getElementById('send').disabled")}
    # New chat empties the log and the stored conversation, and a reload keeps it empty.
    page.js("document.getElementById('new').click()")
    result["new_chat"] = {"messages": page.js(MESSAGES), "stored": page.js("localStorage.getItem('llm-chat')"),
                          "context": page.js("document.getElementById('context_text').textContent")}
    reload(page)
    result["new_chat"]["after_reload"] = page.js(MESSAGES)
    print(json.dumps(result))
finally:
    browser.kill()
    browser.wait()
    shutil.rmtree(profile, ignore_errors=True)
