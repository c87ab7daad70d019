//! A model URL downloaded into a `.partial` file with a progress bar, resuming what an earlier
//! or interrupted transfer left there (an HTTP `Range` request from its length). Hashing and
//! the verdict are the caller's (`model.rs`): this only moves bytes.

use std::fs;
use std::io::{self, Read, Seek, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Transfers cut this many times in a row without any progress end the download.
const ATTEMPTS: u32 = 5;

/// Appends the rest of `url` to `partial` until it holds the whole file. `expect_size`, when
/// the profile gives one, is held against the size the source announces.
pub fn fetch(url: &str, partial: &Path, expect_size: Option<u64>) -> Result<()> {
    let agent = agent();
    let mut failures = 0;
    loop {
        let offset = fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
        let (mut body, start, total) = match open(&agent, url, offset)? {
            Opened::Complete => return Ok(()),
            Opened::Body {
                reader,
                start,
                total,
            } => (reader, start, total),
        };
        if let (Some(total), Some(expect)) = (total, expect_size) {
            if total != expect {
                bail!(
                    "{url} is {total} bytes, but the profile's model.size_bytes says {expect}: \
                     fix the URL or the profile"
                );
            }
        }
        if start > 0 {
            eprintln!("resuming {url} at {} MiB", start >> 20);
        }
        let mut out = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(start > 0)
            .truncate(start == 0)
            .open(partial)
            .with_context(|| format!("open {}", partial.display()))?;
        let mut progress = Progress::new(url, total.or(expect_size), start);
        let result = copy(&mut *body, &mut out, &mut progress);
        progress.finish();
        out.sync_all()
            .with_context(|| format!("write {}", partial.display()))?;
        let now = fs::metadata(partial)?.len();
        match result {
            Ok(()) if total.is_none_or(|t| now >= t) => return Ok(()),
            Ok(()) => eprintln!("{url}: the transfer ended at {now} of {total:?} bytes"),
            Err(e) => eprintln!("{url}: the transfer was cut at {now} bytes: {e}"),
        }
        failures = if now > offset { 1 } else { failures + 1 };
        if failures >= ATTEMPTS {
            bail!(
                "{url}: {ATTEMPTS} transfers in a row ended without progress at {now} bytes; \
                 run again to resume from there"
            );
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            // A status is an answer this module reads (206, 416), not an error.
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            // A stalled transfer is cut and resumed rather than waited on forever.
            .timeout_per_read(Some(Duration::from_secs(60)))
            // The system's trust store, as curl and pip use: a network whose proxy presents its
            // own CA (installed there) reaches PyPI and Hugging Face; Mozilla's bundled roots
            // would refuse it.
            .tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ureq::tls::RootCerts::PlatformVerifier)
                    .build(),
            )
            .build(),
    )
}

enum Opened {
    /// The source from byte `start`, which is the partial file's length or 0 (a source that
    /// cannot resume sends everything again).
    Body {
        reader: Box<dyn Read>,
        start: u64,
        total: Option<u64>,
    },
    /// The partial file already holds all the source has.
    Complete,
}

fn open(agent: &ureq::Agent, url: &str, offset: u64) -> Result<Opened> {
    if let Some(path) = url.strip_prefix("file://") {
        let mut file = fs::File::open(path).with_context(|| format!("open {url}"))?;
        let total = file.metadata()?.len();
        if offset >= total && offset > 0 {
            return Ok(Opened::Complete);
        }
        file.seek(io::SeekFrom::Start(offset))?;
        return Ok(Opened::Body {
            reader: Box::new(file),
            start: offset,
            total: Some(total),
        });
    }
    let mut request = agent.get(url);
    if offset > 0 {
        request = request.header("Range", format!("bytes={offset}-"));
    }
    let response = request.call().with_context(|| format!("GET {url}"))?;
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let length = header("content-length").and_then(|v| v.parse::<u64>().ok());
    let (start, total) = match status {
        200 => (0, length),
        206 => {
            let range = header("content-range").unwrap_or_default();
            let (first, total) = parse_content_range(&range)
                .with_context(|| format!("GET {url}: 206 with Content-Range `{range}`"))?;
            if first != offset {
                bail!("GET {url}: asked for bytes from {offset}, got them from {first}");
            }
            (offset, total.or(length.map(|l| l + offset)))
        }
        // Nothing left past the partial file's end: it is complete (or too long, which the
        // hash then tells).
        416 if offset > 0 => return Ok(Opened::Complete),
        _ => bail!("GET {url}: HTTP {status}; check model.url"),
    };
    Ok(Opened::Body {
        reader: Box::new(response.into_body().into_reader()),
        start,
        total,
    })
}

/// `bytes FIRST-LAST/TOTAL` (TOTAL may be `*`) as (FIRST, TOTAL).
fn parse_content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let (range, total) = value.strip_prefix("bytes ")?.split_once('/')?;
    let first = range.split_once('-')?.0.parse().ok()?;
    Some((first, total.parse().ok()))
}

fn copy(body: &mut dyn Read, out: &mut fs::File, progress: &mut Progress) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 18];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(&buf[..n])?;
        progress.advance(n as u64);
    }
}

/// indicatif's bar on a terminal; elsewhere (CI logs, tests) a line at every tenth, so a
/// long download is never silent.
struct Progress {
    bar: indicatif::ProgressBar,
    name: String,
    total: Option<u64>,
    position: u64,
    tenths_shown: u64,
}

impl Progress {
    fn new(url: &str, total: Option<u64>, start: u64) -> Progress {
        let bar = match total {
            Some(total) => indicatif::ProgressBar::new(total),
            None => indicatif::ProgressBar::no_length(),
        }
        .with_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("valid template"),
        )
        .with_position(start);
        let name = url.rsplit('/').next().unwrap_or(url).to_owned();
        let tenths_shown = total.map_or(0, |t| tenths(start, t));
        Progress {
            bar,
            name,
            total,
            position: start,
            tenths_shown,
        }
    }

    fn advance(&mut self, n: u64) {
        self.position += n;
        self.bar.inc(n);
        if let (true, Some(total)) = (self.bar.is_hidden(), self.total) {
            let now = tenths(self.position, total);
            if now > self.tenths_shown {
                self.tenths_shown = now;
                eprintln!(
                    "{}: {}% ({} of {} MiB)",
                    self.name,
                    now * 10,
                    self.position >> 20,
                    total >> 20
                );
            }
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

fn tenths(position: u64, total: u64) -> u64 {
    (position.min(total) * 10).checked_div(total).unwrap_or(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_is_read() {
        assert_eq!(
            parse_content_range("bytes 100-199/200"),
            Some((100, Some(200)))
        );
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(parse_content_range("items 1-2/3"), None);
    }
}
