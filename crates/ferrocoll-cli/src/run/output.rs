//! Forwarding the ranks' output, line by line, each line whole and after
//! its prefix.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use super::POLL;

/// Longest piece of output forwarded as one line: a longer line (or output
/// without newlines) is cut into pieces of this size.
const MAX_LINE: u64 = 64 * 1024;

/// Where a rank's output goes.
#[derive(Clone, Copy)]
pub(super) enum Sink {
    Stdout,
    Stderr,
}

/// A thread that copies `src` line by line to `sink`, each line written
/// whole (under the stream's lock) after `prefix`.
pub(super) fn pump(src: impl Read + Send + 'static, sink: Sink, prefix: Vec<u8>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(src);
        let mut buf = Vec::new();
        let mut line = Vec::new();
        loop {
            buf.clear();
            match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
            line.clear();
            line.extend_from_slice(&prefix);
            line.extend_from_slice(&buf);
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            // A closed stdout / stderr: keep draining so the rank does not
            // block on a full pipe.
            let _ = match sink {
                Sink::Stdout => {
                    let mut out = io::stdout().lock();
                    out.write_all(&line).and_then(|()| out.flush())
                }
                Sink::Stderr => io::stderr().lock().write_all(&line),
            };
        }
    })
}

/// Waits until every output thread is done or `deadline` passes; joins the
/// finished ones and leaves the others running. True when all finished.
pub(super) fn wait_for_output(pumps: &mut Vec<JoinHandle<()>>, deadline: Instant) -> bool {
    loop {
        let (done, rest): (Vec<_>, Vec<_>) = pumps.drain(..).partition(|p| p.is_finished());
        for p in done {
            let _ = p.join();
        }
        *pumps = rest;
        if pumps.is_empty() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
}
