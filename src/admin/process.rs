//! The standard `process_*` figures (what every Prometheus client library exports),
//! read from /proc/self by the admin thread when it renders: the reactor never waits
//! on a file, and none of this is broker state.

use super::rss_bytes;

/// Field numbers in /proc/self/stat (proc(5)), counted from 1 as the man page does.
const STAT_UTIME: usize = 14;
const STAT_STIME: usize = 15;
const STAT_STARTTIME: usize = 22;
const STAT_VSIZE: usize = 23;
/// The fields after `comm` start at field 3 (`state`).
const STAT_FIRST_AFTER_COMM: usize = 3;
const MICROSECONDS_PER_SECOND: u64 = 1_000_000;

/// What `/metrics` shows as `process_*`; 0 where /proc does not say.
#[derive(Debug, Clone, Default)]
pub struct ProcessFigures {
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    pub max_fds: u64,
    /// Since the Unix epoch; microseconds keep the clock ticks exact.
    pub start_time_us: u64,
    /// User plus system time.
    pub cpu_us: u64,
}

pub fn read() -> ProcessFigures {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // `comm` may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let field = |n: usize| {
        fields
            .get(n - STAT_FIRST_AFTER_COMM)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    let ticks_to_us = |t: u64| t.saturating_mul(MICROSECONDS_PER_SECOND) / ticks;
    let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    ProcessFigures {
        resident_bytes: rss_bytes(),
        virtual_bytes: field(STAT_VSIZE),
        open_fds,
        max_fds,
        start_time_us: boot_time_s() * MICROSECONDS_PER_SECOND + ticks_to_us(field(STAT_STARTTIME)),
        cpu_us: ticks_to_us(field(STAT_UTIME) + field(STAT_STIME)),
    }
}

/// Seconds since the epoch at boot (`btime` in /proc/stat): /proc/self/stat gives the
/// start time in ticks after boot.
fn boot_time_s() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_figures_come_from_proc() {
        let p = read();
        assert!(p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes);
        assert!(p.open_fds >= 3 && p.max_fds >= p.open_fds, "{p:?}");
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        // Started before now, and not long before (this test process).
        let hour_us = 3_600 * MICROSECONDS_PER_SECOND;
        assert!(
            p.start_time_us <= now_us && p.start_time_us + hour_us > now_us,
            "{p:?}"
        );
        let busy = std::time::Instant::now();
        while busy.elapsed().as_millis() < 50 {}
        assert!(read().cpu_us > 0);
    }
}
