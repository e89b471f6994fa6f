//! The control input: lines the engine writes to the helper's standard
//! input (`ports N M ...`), read without blocking when `poll` says there is
//! something, split into lines and parsed. Never a reason to stop: a bad
//! line is an error for the caller to report, the end of input just stops
//! the reading.

use std::io;

/// The longest line kept: every port (65,535 of them, 6 bytes each) fits.
const MAX_LINE: usize = 512 << 10;

/// A command from the engine.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// The whole new set of ports to capture (possibly empty).
    Ports(Vec<u16>),
}

/// Parses one line (without its newline). `None` for a blank line.
pub fn parse(line: &str) -> Option<Result<Command, String>> {
    let mut words = line.split_ascii_whitespace();
    let verb = words.next()?;
    if verb != "ports" {
        return Some(Err(format!("unknown control command {:?}", short(verb))));
    }
    let mut ports = Vec::new();
    for w in words {
        match w.parse::<u16>() {
            Ok(p) if p != 0 => {
                if !ports.contains(&p) {
                    ports.push(p);
                }
            }
            _ => return Some(Err(format!("bad port {:?}", short(w)))),
        }
    }
    Some(Ok(Command::Ports(ports)))
}

/// At most 32 characters of a word, for an error message.
fn short(word: &str) -> String {
    word.chars().take(32).collect()
}

/// The bytes read so far, cut into lines.
#[derive(Default)]
pub struct Lines {
    partial: Vec<u8>,
    /// Skipping the rest of a line that grew past [`MAX_LINE`].
    overlong: bool,
}

impl Lines {
    /// Takes `bytes` read from the input; returns each line it completes
    /// (an overlong or non-UTF-8 line as an error).
    pub fn push(&mut self, mut bytes: &[u8]) -> Vec<Result<String, String>> {
        let mut lines = Vec::new();
        while let Some(nl) = bytes.iter().position(|b| *b == b'\n') {
            let (head, rest) = bytes.split_at(nl);
            bytes = &rest[1..];
            if self.overlong {
                self.overlong = false;
                self.partial.clear();
                lines.push(Err(format!("control line longer than {MAX_LINE} bytes")));
                continue;
            }
            self.partial.extend_from_slice(head);
            let line = std::mem::take(&mut self.partial);
            lines.push(String::from_utf8(line).map_err(|_| "control line is not UTF-8".into()));
        }
        if !self.overlong {
            self.partial.extend_from_slice(bytes);
            if self.partial.len() > MAX_LINE {
                self.overlong = true;
                self.partial = Vec::new();
            }
        }
        lines
    }
}

/// Reads what standard input holds now (one `read`, after `poll` said it
/// is readable). `Ok(None)` at its end.
pub fn read_stdin(buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: reads into a live buffer of `buf.len()` bytes.
    let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
    match n {
        0 => Ok(None),
        n if n > 0 => Ok(Some(n as usize)),
        _ => {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => Ok(Some(0)),
                _ => Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ports_line_is_the_whole_new_set_and_may_be_empty() {
        assert_eq!(
            parse("ports 11434 8080 11434"),
            Some(Ok(Command::Ports(vec![11434, 8080])))
        );
        assert_eq!(parse("ports"), Some(Ok(Command::Ports(Vec::new()))));
        assert_eq!(parse("  ports\t1  "), Some(Ok(Command::Ports(vec![1]))));
        assert_eq!(parse("   "), None);
    }

    #[test]
    fn a_bad_line_is_an_error_not_a_change() {
        assert!(parse("ports 0").unwrap().is_err());
        assert!(parse("ports 70000").unwrap().is_err());
        assert!(parse("ports 80 x").unwrap().is_err());
        assert!(parse("stop").unwrap().is_err());
    }

    #[test]
    fn lines_are_cut_across_reads_and_an_overlong_one_is_skipped_whole() {
        let mut l = Lines::default();
        assert!(l.push(b"ports 1").is_empty());
        assert_eq!(
            l.push(b"1434\nports\n"),
            [Ok("ports 11434".into()), Ok("ports".into())]
        );
        let long = vec![b'9'; MAX_LINE + 10];
        assert!(l.push(b"ports ").is_empty());
        assert!(l.push(&long).is_empty());
        let got = l.push(b"99\nports 5\n");
        assert!(got[0].is_err(), "{got:?}");
        assert_eq!(got[1], Ok("ports 5".into()));
        assert_eq!(l.push(b"\xff\n").len(), 1);
    }
}
