//! The harness of the fault suite (`e2e/tests/fault_suite.rs` and
//! `e2e/tests/fault_suite_control.rs`, "no accepted event is lost"): dispatcher
//! and operator processes to SIGKILL, stop and restart ([`Dispatchers`], [`Operators`]), a numbered event stream published at a steady rate that remembers
//! which events JetStream acknowledged and when ([`publish_stream`]), the accounting of
//! what each endpoint's receiver got against that ([`account`]), evidence about lost
//! events from the streams and the attempt log ([`explain_lost`]), and the report row
//! ([`Row`]), and a record of every change of some KV keys as this process saw it
//! ([`KvLog`]).
//!
//! Every wait here is a poll with a deadline; every loop is bounded.

mod accounting;
mod observe;
mod processes;
mod report;
mod stream;

pub use accounting::*;
pub use observe::*;
pub use processes::*;
pub use report::*;
pub use stream::*;
