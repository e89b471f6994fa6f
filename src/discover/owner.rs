//! Who owns a listening socket: the socket's inode, then the process whose
//! file descriptors point at it, then that process's name, executable and
//! command line, and its parent's name.
//!
//! Read from `/proc` (through the `procfs` crate, under a root that tests
//! replace with a fake tree). Only the processes a user may read reveal
//! their descriptors: a model server run by another user (Ollama's system
//! service runs as `ollama`) has no owner here, and is judged by its port
//! alone. The walk over every process's descriptors is the watcher's one
//! costly step, so it runs only for sockets that just appeared, never on
//! every look.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use procfs::process::{FDTarget, Process};

/// The process that owns a socket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    pub pid: i32,
    /// `/proc/PID/comm`: the executable's name cut to 15 bytes, or the
    /// title the process gave itself.
    pub comm: String,
    /// The executable, where it can be read.
    pub exe: Option<PathBuf>,
    /// The command line, one argument a string (empty when unreadable).
    pub cmdline: Vec<String>,
    /// The parent's `comm`: how a runner started by a server (llama-server
    /// under Ollama) is told apart from one a user started.
    pub parent_comm: Option<String>,
}

/// Finds the owners of `inodes` among the processes under `proc_root`.
/// Sockets whose owner can't be read are absent from the answer.
pub fn find_owners(proc_root: &Path, inodes: &BTreeSet<u64>) -> HashMap<u64, Owner> {
    let mut owners = HashMap::new();
    if inodes.is_empty() {
        return owners;
    }
    for pid in pids(proc_root) {
        let Ok(process) = Process::new_with_root(proc_root.join(pid.to_string())) else {
            continue;
        };
        let held: Vec<u64> = socket_inodes(&process)
            .filter(|inode| inodes.contains(inode) && !owners.contains_key(inode))
            .collect();
        if held.is_empty() {
            continue;
        }
        let owner = describe(proc_root, &process);
        for inode in held {
            owners.insert(inode, owner.clone());
        }
        if owners.len() == inodes.len() {
            break;
        }
    }
    owners
}

/// The numeric entries of `proc_root`, in order.
fn pids(proc_root: &Path) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = dir
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// The inodes of the sockets `process` holds open (none when its
/// descriptors can't be read).
pub(super) fn socket_inodes(process: &Process) -> impl Iterator<Item = u64> {
    process
        .fd()
        .into_iter()
        .flatten()
        .filter_map(|fd| match fd.ok()?.target {
            FDTarget::Socket(inode) => Some(inode),
            _ => None,
        })
}

/// What the process says about itself, each part where readable.
fn describe(proc_root: &Path, process: &Process) -> Owner {
    let pid = process.pid();
    let parent_comm = process
        .stat()
        .ok()
        .and_then(|stat| read_comm(proc_root, stat.ppid));
    Owner {
        pid,
        comm: read_comm(proc_root, pid).unwrap_or_default(),
        exe: process.exe().ok(),
        cmdline: process.cmdline().unwrap_or_default(),
        parent_comm,
    }
}

fn read_comm(proc_root: &Path, pid: i32) -> Option<String> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm")).ok()?;
    Some(text.trim_end_matches('\n').to_owned())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a process `pid` in the fake `/proc` at `root`: its `comm`,
    /// `stat` (with its parent), `cmdline`, `exe` link and one descriptor
    /// per socket inode.
    pub(crate) fn fake_process(
        root: &Path,
        pid: i32,
        ppid: i32,
        comm: &str,
        cmdline: &[&str],
        sockets: &[u64],
    ) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
        std::fs::write(
            dir.join("stat"),
            format!("{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"),
        )
        .unwrap();
        std::fs::write(dir.join("cmdline"), cmdline.join("\0") + "\0").unwrap();
        if let Some(first) = cmdline.first() {
            std::os::unix::fs::symlink(first, dir.join("exe")).unwrap();
        }
        std::os::unix::fs::symlink("/dev/null", dir.join("fd/0")).unwrap();
        for (i, inode) in sockets.iter().enumerate() {
            let link = dir.join(format!("fd/{}", i + 3));
            std::os::unix::fs::symlink(format!("socket:[{inode}]"), link).unwrap();
        }
    }

    #[test]
    fn a_sockets_owner_is_found_with_its_name_command_line_and_parent() {
        let root = tempfile::tempdir().unwrap();
        fake_process(root.path(), 1, 0, "systemd", &["/sbin/init"], &[]);
        fake_process(
            root.path(),
            200,
            1,
            "ollama",
            &["/usr/bin/ollama", "serve"],
            &[10, 11],
        );
        fake_process(
            root.path(),
            300,
            200,
            "llama-server",
            &["/usr/lib/ollama/llama-server", "--port", "41234"],
            &[12],
        );
        let owners = find_owners(root.path(), &BTreeSet::from([11, 12, 99]));
        assert_eq!(owners.len(), 2, "inode 99 has no owner: {owners:?}");
        let ollama = &owners[&11];
        assert_eq!((ollama.pid, ollama.comm.as_str()), (200, "ollama"));
        assert_eq!(ollama.cmdline, vec!["/usr/bin/ollama", "serve"]);
        assert_eq!(ollama.exe.as_deref(), Some(Path::new("/usr/bin/ollama")));
        let runner = &owners[&12];
        assert_eq!(runner.parent_comm.as_deref(), Some("ollama"));
    }

    #[test]
    fn a_process_whose_descriptors_cant_be_read_owns_nothing() {
        let root = tempfile::tempdir().unwrap();
        fake_process(
            root.path(),
            5,
            1,
            "ollama",
            &["/usr/bin/ollama", "serve"],
            &[],
        );
        std::fs::remove_dir_all(root.path().join("5/fd")).unwrap();
        assert!(find_owners(root.path(), &BTreeSet::from([1])).is_empty());
    }

    #[test]
    fn no_inodes_asked_means_no_walk_and_no_owner() {
        let root = tempfile::tempdir().unwrap();
        fake_process(root.path(), 5, 1, "ollama", &["/usr/bin/ollama"], &[1]);
        assert!(find_owners(root.path(), &BTreeSet::new()).is_empty());
    }
}
