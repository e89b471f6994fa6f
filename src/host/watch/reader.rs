//! The watcher's eyes: a plain thread that reads the kernel's listener
//! table every interval and hands a reading over only when it differs from
//! the last one.
//!
//! A thread and `sleep`, not a tokio timer: an idle machine then costs one
//! wake-up per interval and nothing else (tokio's timer wheel wakes its
//! driver up to three times for one deadline seconds away: at the start of
//! the wheel's slots holding it, then at the deadline), and the async side
//! wakes only when something changed. Reading the two files is blocking
//! I/O anyway, which this keeps off the runtime's threads.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::discover::listeners::ListenerTable;

/// Starts the reader; it stops at the first look after the receiver is
/// dropped (the engine stopped). Its first reading is always sent.
pub(super) fn spawn(proc_root: PathBuf, every: Duration) -> mpsc::UnboundedReceiver<ListenerTable> {
    let (tx, rx) = mpsc::unbounded_channel();
    let started = std::thread::Builder::new()
        .name("speedtap-watch".into())
        .spawn(move || read_until_closed(&proc_root, every, &tx));
    if let Err(e) = started {
        tracing::warn!(
            "cannot start the listener watcher: {e}; servers started later won't be found"
        );
    }
    rx
}

fn read_until_closed(
    proc_root: &std::path::Path,
    every: Duration,
    tx: &mpsc::UnboundedSender<ListenerTable>,
) {
    let mut last: Option<ListenerTable> = None;
    let mut warned = false;
    while !tx.is_closed() {
        match ListenerTable::read(proc_root) {
            Ok(table) if last.as_ref() != Some(&table) => {
                if tx.send(table.clone()).is_err() {
                    return;
                }
                last = Some(table);
            }
            Ok(_) => {}
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(
                    "cannot read the listening sockets under {}: {e}",
                    proc_root.display()
                );
            }
            Err(_) => {}
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::listeners::tests::{tcp4_line, TCP_HEADER};

    #[test]
    fn a_reading_is_sent_first_then_only_when_the_table_changes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("net")).unwrap();
        let tcp = root.path().join("net/tcp");
        let write = |lines: &[(u16, u64)]| {
            let body: String = lines
                .iter()
                .map(|(port, inode)| tcp4_line([127, 0, 0, 1], *port, 0x0A, 1000, *inode))
                .collect();
            // Replaced whole (written beside, then renamed over), as the
            // kernel's table is: the reader, looking every 2 ms, must never
            // catch a half-written file and send that as a change.
            let next = tcp.with_extension("next");
            std::fs::write(&next, format!("{TCP_HEADER}{body}")).unwrap();
            std::fs::rename(&next, &tcp).unwrap();
        };
        write(&[(11434, 1)]);
        let mut rx = spawn(root.path().to_path_buf(), Duration::from_millis(2));
        let ports = |t: ListenerTable| t.ports.keys().copied().collect::<Vec<u16>>();
        assert_eq!(ports(rx.blocking_recv().unwrap()), [11434]);
        write(&[(11434, 1), (9931, 2)]);
        assert_eq!(ports(rx.blocking_recv().unwrap()), [9931, 11434]);
        // The readings in between were the same table: none of them was
        // sent, so the next one received is the next change.
        write(&[(9931, 2)]);
        assert_eq!(ports(rx.blocking_recv().unwrap()), [9931]);
    }
}
