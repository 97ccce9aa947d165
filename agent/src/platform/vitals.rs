//! What the host says about the agent's processes and the SoC, for telemetry: resident memory
//! from `/proc/<pid>/status` and the highest thermal-zone temperature from
//! `/sys/class/thermal/*/temp` (or the zones under `LAYA_THERMAL_DIR`: a container that mounts
//! the host's sysfs elsewhere, and the tests' zones of known temperature). Anything unreadable
//! (another OS, a hardened unit without `/sys`, a worker that just exited) is `None`, never an
//! error: telemetry goes out regardless.

use std::path::Path;

/// `VmRSS` of a process, in KiB.
pub fn rss_kb(pid: u32) -> Option<u64> {
    rss_from_status(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// `VmRSS` of this process, in KiB.
pub fn own_rss_kb() -> Option<u64> {
    rss_from_status(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// The `VmRSS:` line of a `/proc/<pid>/status` text (`VmRSS:     12345 kB`).
fn rss_from_status(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.trim_start_matches("VmRSS:").split_whitespace().next()?.parse().ok()
}

/// Where the thermal zones are read unless `LAYA_THERMAL_DIR` names another directory.
pub const THERMAL_DIR: &str = "/sys/class/thermal";

/// The highest temperature of the thermal zones under [`THERMAL_DIR`] (or `LAYA_THERMAL_DIR`),
/// in °C.
pub fn max_temperature_c() -> Option<f64> {
    match std::env::var_os("LAYA_THERMAL_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => max_temperature_in(Path::new(&dir)),
        None => max_temperature_in(Path::new(THERMAL_DIR)),
    }
}

/// The highest `*/temp` (millidegrees Celsius) under `dir`. Zones that cannot be read or say
/// something implausible (a disabled sensor reads an error or a huge value) are skipped.
pub fn max_temperature_in(dir: &Path) -> Option<f64> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|zone| std::fs::read_to_string(zone.path().join("temp")).ok())
        .filter_map(|t| t.trim().parse::<i64>().ok())
        .map(|milli| milli as f64 / 1000.0)
        .filter(|c| (-60.0..=250.0).contains(c))
        .reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rss_line_is_read_in_kib() {
        let text = "Name:\tlaya-edge\nVmPeak:\t  90000 kB\nVmRSS:\t   12345 kB\nThreads:\t4\n";
        assert_eq!(rss_from_status(text), Some(12345));
        assert_eq!(rss_from_status("Name:\tx\n"), None);
        assert!(own_rss_kb().is_some_and(|kb| kb > 0), "this test process has resident memory");
        assert!(rss_kb(std::process::id()).is_some_and(|kb| kb > 0), "read by pid too");
    }

    #[test]
    fn the_hottest_readable_zone_wins_and_broken_zones_are_skipped() {
        let dir = std::env::temp_dir().join(format!("laya-thermal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (zone, text) in [("thermal_zone0", "41000\n"), ("thermal_zone1", "67500\n"), ("thermal_zone2", "oops")] {
            std::fs::create_dir_all(dir.join(zone)).unwrap();
            std::fs::write(dir.join(zone).join("temp"), text).unwrap();
        }
        // A disabled sensor's nonsense reading.
        std::fs::create_dir_all(dir.join("thermal_zone3")).unwrap();
        std::fs::write(dir.join("thermal_zone3").join("temp"), "999999999\n").unwrap();
        // A zone without a temp file.
        std::fs::create_dir_all(dir.join("cooling_device0")).unwrap();
        assert_eq!(max_temperature_in(&dir), Some(67.5));
        assert_eq!(max_temperature_in(&dir.join("nowhere")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
