//! Helpers of the memory-bound test binaries. Each measurement is a test
//! binary of its own, so that the process's peak RSS (`VmHWM`) belongs to
//! it alone. Each says which allocator it runs with and why: peak RSS under
//! memory pressure depends on it by tens of megabytes.

/// `VmHWM` or `VmRSS` of this process in bytes (Linux).
pub fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Current RSS, after resetting the peak to it (Linux ≥ 4.0), so that the
/// next `VmHWM` is the peak from now on; `None` where either is missing.
pub fn rss_with_peak_reset() -> Option<u64> {
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    status_bytes("VmRSS:")
}

/// How much the peak RSS rose above `before`.
pub fn peak_growth(before: u64) -> u64 {
    status_bytes("VmHWM:")
        .unwrap_or(u64::MAX)
        .saturating_sub(before)
}
