//! CPU time and peak memory of a proxy's process tree, from /proc.
//!
//! A tree because nginx works in a worker under its master and LiteLLM
//! may start helpers: the tree is the root plus every process whose
//! parent chain leads to it, found by scanning /proc/*/stat for parent
//! ids. CPU is utime + stime of every live member plus cutime + cstime
//! (children that already exited and were waited for), so time does not
//! vanish when a helper exits between two readings. Peak memory is the
//! sum of VmHWM (each process's own high-water RSS) over the live tree;
//! a sum of peaks reached at different moments can only over-state the
//! tree's peak, never hide it.

use std::collections::HashMap;
use std::fs;

/// Kernel clock ticks per second, the unit of /proc/<pid>/stat times.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The fields after `comm` in /proc/<pid>/stat (comm may hold spaces and
/// parentheses, so split after its last `)`).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &text[text.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_owned).collect())
}

/// `root` and all its descendants that are alive now.
pub fn tree(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            // Fields after comm: state(0) ppid(1) ...
            if let Some(ppid) = stat_fields(pid).and_then(|f| f.get(1)?.parse::<u32>().ok()) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        if let Some(kids) = children.get(&out[i]) {
            out.extend(kids);
        }
        i += 1;
    }
    out
}

/// CPU seconds (user + system, reaped children included) of the tree.
pub fn tree_cpu_secs(root: u32) -> f64 {
    let ticks: u64 = tree(root)
        .into_iter()
        .filter_map(stat_fields)
        .map(|f| {
            // utime(11) stime(12) cutime(13) cstime(14), counted from state.
            f[11..15]
                .iter()
                .filter_map(|v| v.parse::<i64>().ok())
                .map(|v| v.max(0) as u64)
                .sum::<u64>()
        })
        .sum();
    ticks as f64 / clock_ticks()
}

/// Sum of VmHWM over the live tree, in bytes.
pub fn tree_peak_rss(root: u32) -> u64 {
    tree(root)
        .into_iter()
        .filter_map(|pid| fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .sum()
}

/// Context switches (voluntary and not) of every thread in the tree so
/// far: a proxy that hands each chunk to another thread pays a wake-up per
/// chunk, which shows here.
pub fn tree_ctx_switches(root: u32) -> u64 {
    let mut total = 0;
    for pid in tree(root) {
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(status) = fs::read_to_string(task.path().join("status")) else {
                continue;
            };
            total += status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    total
}

/// This process's own CPU seconds (client and upstream), without its
/// children (the proxies).
pub fn self_cpu_secs() -> f64 {
    let ticks: u64 = stat_fields(std::process::id())
        .map(|f| f[11..13].iter().filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    ticks as f64 / clock_ticks()
}
