//! Giving the memory calls used back to the system once speedtap is idle.
//!
//! When the tokenizer's tables are let go (after [`super::IDLE_RELEASE`]
//! without a metered call), two kinds of memory the calls brought in would
//! otherwise stay with the process for as long as it runs, idle or not:
//! - the heap pages the tables (some 200,000 small allocations) and the
//!   calls freed: glibc keeps them in its arenas unless asked to return
//!   them (`malloc_trim`);
//! - the pages of speedtap's own program the calls read: the tokenizer's
//!   vocabulary (3.6 MB embedded in the binary, read once to build the
//!   tables) and the code of the metering path. They are file pages, so
//!   the kernel keeps them mapped until memory runs short; measured with
//!   `scripts/footprint --calls 100`, they were 5 MB of the 6 MB the tray
//!   app still held ten minutes after its last call. `MADV_PAGEOUT` hands
//!   them back now. It never changes what the process reads: a page paged
//!   out is read again from the program file on its next use (the next
//!   call, which builds the tables again anyway).
//!
//! Only the program's read-only mappings are paged out, so nothing the
//! process wrote can be sent to swap by this. Both steps are best effort: on
//! a kernel older than 5.4 or another C library they do nothing.

use std::path::Path;

/// Returns freed heap pages and the program's read pages to the system.
pub(super) fn give_back() {
    trim_heap();
    page_out_program();
}

fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only returns free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Pages out the read-only mappings of this process's own program file.
#[cfg(target_os = "linux")]
fn page_out_program() {
    let (Ok(exe), Ok(maps)) = (
        std::fs::read_link("/proc/self/exe"),
        std::fs::read_to_string("/proc/self/maps"),
    ) else {
        return;
    };
    for (start, end) in read_only_ranges_of(&maps, &exe) {
        // SAFETY: the range is one whole mapping of this process, taken
        // from its own maps; MADV_PAGEOUT only reclaims pages and keeps
        // their contents (a file page is read again on its next use), so no
        // memory the program relies on changes.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn page_out_program() {}

/// The `(start, end)` address ranges of `file`'s mappings without write
/// permission in a `/proc/<pid>/maps` text (its code and read-only data).
fn read_only_ranges_of(maps: &str, file: &Path) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            // address perms offset dev inode path (the path may hold spaces)
            let mut fields = line.splitn(6, ' ');
            let range = fields.next()?;
            let perms = fields.next()?;
            let path = fields.nth(3)?.trim_start();
            if perms.contains('w') || Path::new(path) != file {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let start = usize::from_str_radix(start, 16).ok()?;
            let end = usize::from_str_radix(end, 16).ok()?;
            (end > start).then_some((start, end))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0b00000 r--p 00000000 fd:01 1234  /usr/bin/speedtap desktop
55d0c0b00000-55d0c0f00000 r-xp 00100000 fd:01 1234  /usr/bin/speedtap desktop
55d0c0f00000-55d0c1000000 r--p 00500000 fd:01 1234  /usr/bin/speedtap desktop
55d0c1000000-55d0c1010000 rw-p 00600000 fd:01 1234  /usr/bin/speedtap desktop
55d0c1010000-55d0c1020000 rw-p 00000000 00:00 0 
7f00aa000000-7f00aa100000 r-xp 00000000 fd:01 99   /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0    [stack]
";

    #[test]
    fn only_the_programs_own_read_only_mappings_are_paged_out() {
        let ranges = read_only_ranges_of(MAPS, Path::new("/usr/bin/speedtap desktop"));
        assert_eq!(
            ranges,
            vec![
                (0x55d0c0a00000, 0x55d0c0b00000),
                (0x55d0c0b00000, 0x55d0c0f00000),
                (0x55d0c0f00000, 0x55d0c1000000),
            ],
            "not its written data, the heap, a library or the stack"
        );
        assert!(read_only_ranges_of(MAPS, Path::new("/usr/bin/other")).is_empty());
    }

    /// One mebibyte of the test program's read-only data, not zeros, so it
    /// is in the file.
    static READ_ONLY: [u8; 1 << 20] = [7; 1 << 20];

    /// Resident kilobytes of the mapping holding `addr` (/proc/self/smaps).
    #[cfg(target_os = "linux")]
    fn resident_kb_at(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((start, end)) = head.split_once('-') {
                if let (Ok(start), Ok(end)) = (
                    usize::from_str_radix(start, 16),
                    usize::from_str_radix(end, 16),
                ) {
                    inside = (start..end).contains(&addr);
                    continue;
                }
            }
            if inside && line.starts_with("Rss:") {
                return line.split_whitespace().nth(1).unwrap().parse().unwrap();
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_programs_pages_read_once_leave_the_process_and_read_the_same_again() {
        let sum = |data: &[u8]| data.iter().map(|&b| u64::from(b)).sum::<u64>();
        let data = std::hint::black_box(&READ_ONLY);
        let addr = data.as_ptr() as usize + data.len() / 2;
        assert_eq!(sum(data), 7 << 20);
        let before = resident_kb_at(addr);
        assert!(before >= 1024, "read, the data is resident: {before} kB");
        page_out_program();
        let after = resident_kb_at(addr);
        assert!(
            after + 512 <= before,
            "paged out: {before} kB resident before, {after} kB after"
        );
        assert_eq!(sum(data), 7 << 20, "read again from the program file");
    }
}
