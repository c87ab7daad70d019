"""The chat page end to end in headless Chromium, driven over the DevTools protocol (a small
WebSocket client on the standard library): open the page, type a message, send it, wait for the
streamed answer to finish, take a screenshot. Prints one JSON object with what the page shows.

Usage: chat_page.py <page url> <screenshot path> <chromium binary>"""

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

url, shot, chromium = sys.argv[1:]


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


profile = tempfile.mkdtemp(prefix="llm-chromium-")
browser = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                            "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                            "--remote-debugging-port=0", "--window-size=1000,760", "about:blank"],
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
    deadline = time.time() + 60
    while page.js("document.readyState") != "complete" or not page.js(
            "document.getElementById('model').textContent.includes('gguf')"):
        if time.time() > deadline:
            raise RuntimeError("the page did not load its model name")
        time.sleep(0.2)
    page.js("document.getElementById('system').value = 'You are brief.';"
            "document.getElementById('max_tokens').value = '24';"
            "document.getElementById('temperature').value = '0';"
            "document.getElementById('input').value = 'Say hello.';"
            "document.getElementById('send').click();")
    # Streaming: some text shows before the answer is done.
    seen_partial = False
    deadline = time.time() + 240
    while True:
        state = page.js("(() => { const a = document.querySelector('.assistant');"
                        " return a ? {text: a.textContent, done: a.dataset.done || null} : null; })()")
        if state and state["text"] and not state["done"]:
            seen_partial = True
        if state and state["done"]:
            break
        if time.time() > deadline:
            raise RuntimeError(f"no finished answer: {state}")
        time.sleep(0.05)
    result = {
        "answer": state["text"], "done": state["done"], "seen_partial": seen_partial,
        "model": page.js("document.getElementById('model').textContent"),
        "speed": page.js("document.getElementById('speed').textContent"),
        "errors": page.js("[...document.querySelectorAll('.error')].map(e => e.textContent)"),
        "send_enabled": page.js("!document.getElementById('send').disabled"),
    }
    # Stop: a long answer, stopped once it has started, ends at once with what had come.
    page.js("document.getElementById('max_tokens').value = '400';"
            "document.getElementById('input').value = 'Tell me a long story.';"
            "document.getElementById('send').click();")
    last = "(() => { const a = [...document.querySelectorAll('.assistant')].pop();" \
           " return {n: document.querySelectorAll('.assistant').length, text: a.textContent, done: a.dataset.done || null}; })()"
    deadline = time.time() + 120
    while True:
        state = page.js(last)
        if state["n"] == 2 and state["text"]:
            break
        if time.time() > deadline:
            raise RuntimeError(f"the second answer did not start: {state}")
        time.sleep(0.05)
    page.js("document.getElementById('stop').click()")
    stopped_at = time.time()
    while not page.js(last)["done"]:
        if time.time() > stopped_at + 10:
            raise RuntimeError("stop did not end the answer")
        time.sleep(0.05)
    result["stop"] = {"done": page.js(last)["done"], "secs": round(time.time() - stopped_at, 2),
                      "send_enabled": page.js("!document.getElementById('send').disabled")}
    png = page.call("Page.captureScreenshot", format="png")["data"]
    with open(shot, "wb") as f:
        f.write(base64.b64decode(png))
    print(json.dumps(result))
finally:
    browser.kill()
    browser.wait()
    shutil.rmtree(profile, ignore_errors=True)
