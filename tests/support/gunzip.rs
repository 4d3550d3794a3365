//! Gzip decoding by the system's `gzip`: a decoder independent of the kit's
//! encoder, for the tests that check what went over the wire.

use std::io::Write;
use std::process::{Command, Stdio};

/// `compressed` decoded; panics naming gzip's complaint if it is not gzip.
pub fn gunzip(compressed: &[u8]) -> Vec<u8> {
    let mut child = Command::new("gzip")
        .arg("-dc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gzip is installed");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = compressed.to_vec();
    // Written from a thread: gzip's output could fill its pipe meanwhile.
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let output = child.wait_with_output().expect("gzip ran");
    writer
        .join()
        .expect("writer thread")
        .expect("gzip read it all");
    assert!(
        output.status.success(),
        "not a gzip stream: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}
