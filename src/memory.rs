//! This process's resident memory, for the examples' and benches' memory reports (the method of
//! `NOTES.md`, "how to measure memory per rank"): Linux's `/proc/self/status` gives the resident
//! set now (`VmRSS`) and its peak (`VmHWM`), and writing `5` to `/proc/self/clear_refs` (Linux
//! 4.0+) resets that peak to the current resident set, so a phase's peak can be read alone.
//! Elsewhere the figures are `None`.

/// A `kB` field of `/proc/self/status` (`"VmHWM:"`, `"VmRSS:"`) in MiB (2^20 bytes); `None`
/// where the file or the field cannot be read.
pub fn status_mib(field: &str) -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
}

/// Resets the peak resident set (`VmHWM`) to the current one; false where the kernel refuses
/// (not Linux, or older than 4.0), and then a later peak includes what came before.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64 MiB buffer touched after the reset raises the peak above the resident set at the
    /// reset by about its size. Other tests of this binary allocate and free on their own
    /// threads meanwhile (the resident set is the process's), so one of a few tries must see it.
    #[test]
    fn peak_follows_an_allocation() {
        if status_mib("VmRSS:").is_none() || !reset_peak() {
            return; // not Linux (or before 4.0): nothing to read
        }
        let mut seen = Vec::new();
        for _ in 0..5 {
            reset_peak();
            let before = status_mib("VmHWM:").unwrap();
            let buf = std::hint::black_box(vec![1u8; 64 << 20]);
            let peak = status_mib("VmHWM:").unwrap();
            drop(buf);
            if peak >= before + 60.0 {
                return;
            }
            seen.push((before, peak));
        }
        panic!("the peak never rose by the buffer's 64 MiB: (at reset, peak) {seen:?}");
    }
}
