//! The seeded chaos soak (`e2e/tests/chaos.rs`, `make soak`): a schedule of what users
//! and operators do at once, drawn from a seed alone ([`schedule::plan`]), and the checks
//! of the delivery contract over what happened ([`check`]). The same seed gives the
//! same schedule; a failing run prints its seed. After Jepsen's generators and
//! checkers: the generator models the system so every step is possible when taken; the
//! checker judges the whole history, not one moment.

pub mod check;
pub mod schedule;

pub use check::{ConfigChange, GRACE, Life, early_retries};
pub use schedule::{Action, OPERATORS, Role, Shape, Step, describe, plan};
