//! The wall clock as Herald records it: Unix milliseconds. Records, ids and schedules
//! carry these; a clock before 1970 reads as 0.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_is_after_herald_was_written() {
        // 2026-01-01T00:00:00Z
        assert!(super::now_ms() > 1_767_225_600_000);
    }
}
