//! The report row of each scenario (the table in `docs/reliability.md`).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use super::Outcome;

/// One scenario's numbers: a row of the table in `docs/reliability.md`.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub fault: String,
    pub events: usize,
    pub endpoints: usize,
    pub injected: String,
    pub lost: usize,
    pub duplicates: usize,
    /// The most requests in flight at once on the ordered endpoint(s).
    pub max_in_flight_ordered: usize,
    pub reorderings: usize,
    pub longest_delay: Duration,
    pub notes: String,
}

/// The table header, written before the first row of a new report file.
pub const REPORT_HEADER: &str = "| fault | events | endpoints | faults injected | lost | duplicates | max in flight (ordered) | reorderings (ordered) | longest delay | notes |\n|---|---|---|---|---|---|---|---|---|---|\n";

impl Row {
    /// The row from the outcomes of a scenario's endpoints.
    pub fn from_outcomes(fault: &str, events: usize, injected: &str, outcomes: &[Outcome]) -> Self {
        Self {
            fault: fault.to_owned(),
            events,
            endpoints: outcomes.len(),
            injected: injected.to_owned(),
            lost: outcomes.iter().map(|o| o.lost.len()).sum(),
            duplicates: outcomes.iter().map(|o| o.duplicates).sum(),
            max_in_flight_ordered: outcomes
                .iter()
                .filter(|o| o.ordered)
                .map(|o| o.max_in_flight)
                .max()
                .unwrap_or(0),
            reorderings: outcomes
                .iter()
                .filter(|o| o.ordered)
                .map(|o| o.reorderings)
                .sum(),
            longest_delay: outcomes
                .iter()
                .map(|o| o.longest_delay)
                .max()
                .unwrap_or_default(),
            notes: String::new(),
        }
    }

    pub fn markdown(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} s | {} |",
            self.fault,
            self.events,
            self.endpoints,
            self.injected,
            self.lost,
            self.duplicates,
            self.max_in_flight_ordered,
            self.reorderings,
            self.longest_delay.as_secs_f64(),
            self.notes.replace('|', "/"),
        )
    }

    /// Prints the row and appends it to the report ([`report_path`]).
    pub fn record(&self) {
        let row = self.markdown();
        println!("{REPORT_HEADER}{row}");
        let path = report_path();
        let new = std::fs::metadata(&path).map_or(true, |m| m.len() == 0);
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(mut file) => {
                if new {
                    let _ = file.write_all(REPORT_HEADER.as_bytes());
                }
                let _ = writeln!(file, "{row}");
            }
            Err(error) => eprintln!("cannot append to {}: {error}", path.display()),
        }
    }
}

/// `$HERALD_FAULT_REPORT`, else `$TMPDIR/herald-fault-report.md`.
pub fn report_path() -> PathBuf {
    std::env::var_os("HERALD_FAULT_REPORT")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("herald-fault-report.md"))
}
