//! What happens in a soak, and when: a schedule drawn from a seed alone. The generator
//! keeps a model of the system (replicas running, the NATS node down, endpoints paused
//! or deleted) so every step is one a user or an operator could take at that moment.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

/// The endpoints of a soak, by what their receiver does and what may happen to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Unordered, a healthy receiver.
    Plain,
    /// `ordered: true` for its whole life; a receiver that takes a moment per request.
    Ordered,
    /// The first attempt of every third event answers 500; an explicit retry schedule.
    Flaky,
    /// Seeded random faults: 500s, hangs past the timeout, resets, slow bodies,
    /// `Retry-After`.
    Chaotic,
    /// Its `ordered` flag is switched on and off.
    Toggle,
}

impl Role {
    pub const ALL: [Role; 5] = [
        Role::Plain,
        Role::Ordered,
        Role::Flaky,
        Role::Chaotic,
        Role::Toggle,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Role::Plain => "plain",
            Role::Ordered => "ordered",
            Role::Flaky => "flaky",
            Role::Chaotic => "chaotic",
            Role::Toggle => "toggle",
        }
    }

    /// The endpoints replays go to: not the flaky one, whose retries are checked against
    /// their schedule (a replayed event is sent again at once, by design).
    pub const REPLAYED: [Role; 2] = [Role::Plain, Role::Ordered];

    /// The endpoints redeliveries go to: not the flaky one (see [`Role::REPLAYED`]).
    pub const REDELIVERED: [Role; 4] = [Role::Plain, Role::Ordered, Role::Chaotic, Role::Toggle];

    /// Whether the soak deletes and re-creates it. The ordered and flaky endpoints stay,
    /// so the namespace always has an endpoint and their checks span the whole run.
    pub fn deletable(self) -> bool {
        matches!(self, Role::Plain | Role::Chaotic | Role::Toggle)
    }
}

/// One thing done to the system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A dispatcher replica started (scale up, or back after a stop).
    StartDispatcher(String),
    /// `kill -9` of a replica.
    KillDispatcher(String),
    /// A graceful stop (SIGINT) of a replica: scale down.
    StopDispatcher(String),
    /// `kill -9` of a nats-server node of the cluster.
    KillNatsNode(usize),
    /// The node started again with its store.
    StartNatsNode(usize),
    Pause(Role),
    Resume(Role),
    /// The endpoint deleted (its pending deliveries are dropped).
    Delete(Role),
    /// An endpoint of the same name created again: a new uid, a new receiver path.
    Recreate(Role),
    /// A new generation of the same spec with another timeout.
    Edit(Role),
    SetOrdered(Role, bool),
    /// The namespace's signing secret gets a new key (the old one stays verifiable).
    RotateKeys,
    /// Another writer takes shard `n`'s lease in `herald-shards` (as a partition between
    /// a replica and the bucket's leader would look to it): the holder's renewals fail, it
    /// gives the shard up, and takes it again once the stolen entry expires.
    StealLease(u32),
    /// A replay of the last 10 s of events to an endpoint (`WebhookReplay` `r<n>`).
    Replay(Role, u32),
    /// The replay deleted, whether it finished or not.
    DeleteReplay(u32),
    /// Control plane only: `kill -9` of an operator replica (the other, if running,
    /// takes the lead once the Lease expires).
    KillOperator(String),
    /// Control plane only: an operator replica started again.
    StartOperator(String),
    /// Control plane only: the Kubernetes API unreachable for this long.
    BlackoutApi(Duration),
    /// Control plane only: the latest event the endpoint received sent again through
    /// herald-api's redeliver.
    Redeliver(Role),
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::StartDispatcher(id) => write!(f, "start dispatcher {id}"),
            Action::KillDispatcher(id) => write!(f, "kill -9 dispatcher {id}"),
            Action::StopDispatcher(id) => write!(f, "stop dispatcher {id} (SIGINT)"),
            Action::KillNatsNode(n) => write!(f, "kill -9 nats node n{n}"),
            Action::StartNatsNode(n) => write!(f, "start nats node n{n}"),
            Action::Pause(r) => write!(f, "pause {}", r.name()),
            Action::Resume(r) => write!(f, "resume {}", r.name()),
            Action::Delete(r) => write!(f, "delete {}", r.name()),
            Action::Recreate(r) => write!(f, "re-create {}", r.name()),
            Action::Edit(r) => write!(f, "edit {}", r.name()),
            Action::SetOrdered(r, on) => write!(f, "set {} ordered={on}", r.name()),
            Action::RotateKeys => write!(f, "rotate the signing keys"),
            Action::StealLease(n) => write!(f, "steal the lease of shard {n}"),
            Action::Replay(r, n) => write!(f, "replay r{n}: the last 10 s to {}", r.name()),
            Action::DeleteReplay(n) => write!(f, "delete replay r{n}"),
            Action::KillOperator(id) => write!(f, "kill -9 operator {id}"),
            Action::StartOperator(id) => write!(f, "start operator {id}"),
            Action::BlackoutApi(d) => write!(f, "Kubernetes API unreachable for {d:.1?}"),
            Action::Redeliver(r) => write!(f, "redeliver {}'s latest event", r.name()),
        }
    }
}

/// An action at a time since the soak began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub at: Duration,
    pub action: Action,
}

/// The size of a soak.
#[derive(Debug, Clone)]
pub struct Shape {
    /// How long things happen; the schedule then restores what is down or paused.
    pub length: Duration,
    /// At most this many dispatcher replicas run at once (at least one always does).
    pub max_dispatchers: usize,
    /// nats-server nodes (3: one may be killed at a time; 1: none is).
    pub nats_nodes: usize,
    /// The mean time between two steps (each gap uniform in [mean/2, 3·mean/2]).
    pub mean_gap: Duration,
    /// The installation's shard count (whose leases may be stolen).
    pub shards: u32,
    /// Endpoints are resources reconciled by [`OPERATORS`] operator replicas, and
    /// herald-api runs: operators are killed, the Kubernetes API goes away, deliveries
    /// are redelivered. Otherwise the soak writes the configuration to NATS itself.
    pub control: bool,
}

/// The operator replicas of a control-plane soak, all running at its start.
pub const OPERATORS: [&str; 2] = ["o0", "o1"];

/// What the generator knows of the system.
#[derive(Default)]
struct Model {
    running: Vec<String>,
    started: usize,
    nats_down: Option<(usize, Duration)>,
    paused: BTreeSet<Role>,
    deleted: BTreeSet<Role>,
    toggle_ordered: bool,
    /// No lease is stolen before this (one stolen at a time, until it has expired).
    steal_after: Duration,
    /// Replays requested so far, and the one not deleted yet (with its endpoint).
    replays: u32,
    replay: Option<(u32, Role)>,
    /// Operator replicas down (a control-plane soak).
    operators_down: BTreeSet<String>,
    /// No blackout of the Kubernetes API begins before this (one at a time).
    api_back: Duration,
}

/// How long a stolen lease keeps its shard from every replica: the bucket's TTL (10 s)
/// and a margin. No other lease is stolen meanwhile.
pub const STOLEN_FOR: Duration = Duration::from_secs(12);

/// The schedule of `seed`: the same seed and shape give the same steps.
pub fn plan(seed: u64, shape: &Shape) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut m = Model::default();
    let mut steps = vec![Step {
        at: Duration::ZERO,
        action: m.start(),
    }];
    let mean = shape.mean_gap.as_millis().max(2) as u64;
    let mut at = Duration::ZERO;
    loop {
        at += Duration::from_millis(rng.u64(mean / 2..=mean * 3 / 2));
        if at >= shape.length {
            break;
        }
        if let Some((node, until)) = m.nats_down
            && until <= at
        {
            m.nats_down = None;
            steps.push(Step {
                at: until,
                action: Action::StartNatsNode(node),
            });
        }
        let choices = m.choices(shape, at);
        let total: u32 = choices.iter().map(|(_, w)| w).sum();
        let mut roll = rng.u32(0..total);
        let choice = choices
            .into_iter()
            .find(|(_, w)| {
                let hit = roll < *w;
                roll = roll.saturating_sub(*w);
                hit
            })
            .map(|(c, _)| c)
            .expect("a choice under the total weight");
        let action = m.apply(choice, &mut rng, at, shape);
        steps.push(Step { at, action });
    }
    // Restore: the node back, every pause lifted.
    let end = shape.length;
    if let Some((node, _)) = m.nats_down.take() {
        steps.push(Step {
            at: end,
            action: Action::StartNatsNode(node),
        });
    }
    for role in std::mem::take(&mut m.paused) {
        steps.push(Step {
            at: end,
            action: Action::Resume(role),
        });
    }
    for id in std::mem::take(&mut m.operators_down) {
        steps.push(Step {
            at: end,
            action: Action::StartOperator(id),
        });
    }
    steps
}

/// The kinds of step the generator picks among.
#[derive(Debug, Clone, Copy)]
enum Choice {
    Start,
    Kill,
    Stop,
    KillNode,
    Pause,
    Resume,
    Delete,
    Recreate,
    Edit,
    Toggle,
    Rotate,
    Steal,
    Replay,
    DeleteReplay,
    KillOperator,
    StartOperator,
    Blackout,
    Redeliver,
}

impl Model {
    fn start(&mut self) -> Action {
        let id = format!("d{}", self.started);
        self.started += 1;
        self.running.push(id.clone());
        Action::StartDispatcher(id)
    }

    /// Every step possible now, with its weight.
    fn choices(&self, shape: &Shape, at: Duration) -> Vec<(Choice, u32)> {
        let live = |r: &Role| !self.deleted.contains(r);
        let mut c = vec![(Choice::Edit, 1), (Choice::Rotate, 1)];
        if self.running.len() < shape.max_dispatchers {
            c.push((Choice::Start, 3));
        }
        if self.running.len() > 1 {
            c.push((Choice::Kill, 2));
            c.push((Choice::Stop, 2));
        }
        if shape.nats_nodes >= 3 && self.nats_down.is_none() {
            c.push((Choice::KillNode, 2));
        }
        if Role::ALL
            .iter()
            .any(|r| live(r) && !self.paused.contains(r))
        {
            c.push((Choice::Pause, 1));
        }
        if !self.paused.is_empty() {
            c.push((Choice::Resume, 2));
        }
        if Role::ALL
            .iter()
            .any(|r| r.deletable() && live(r) && !self.paused.contains(r))
        {
            c.push((Choice::Delete, 1));
        }
        if !self.deleted.is_empty() {
            c.push((Choice::Recreate, 2));
        }
        if live(&Role::Toggle) {
            c.push((Choice::Toggle, 1));
        }
        if self.replay.is_none() && Role::REPLAYED.iter().any(live) {
            c.push((Choice::Replay, 1));
        }
        if self.replay.is_some() {
            c.push((Choice::DeleteReplay, 1));
        }
        if at >= self.steal_after {
            c.push((Choice::Steal, 1));
        }
        if shape.control {
            if self.operators_down.is_empty() {
                c.push((Choice::KillOperator, 2));
            } else {
                c.push((Choice::StartOperator, 3));
            }
            if at >= self.api_back {
                c.push((Choice::Blackout, 1));
            }
            if Role::REDELIVERED.iter().any(live) {
                c.push((Choice::Redeliver, 2));
            }
        }
        c
    }

    fn apply(
        &mut self,
        choice: Choice,
        rng: &mut fastrand::Rng,
        at: Duration,
        shape: &Shape,
    ) -> Action {
        let pick = |rng: &mut fastrand::Rng, from: Vec<Role>| from[rng.usize(..from.len())];
        let live: Vec<Role> = Role::ALL
            .into_iter()
            .filter(|r| !self.deleted.contains(r))
            .collect();
        match choice {
            Choice::Start => self.start(),
            Choice::Kill | Choice::Stop => {
                let id = self.running.remove(rng.usize(..self.running.len()));
                match choice {
                    Choice::Kill => Action::KillDispatcher(id),
                    _ => Action::StopDispatcher(id),
                }
            }
            Choice::KillNode => {
                let node = rng.usize(..shape.nats_nodes);
                let down = Duration::from_millis(rng.u64(3_000..=8_000));
                self.nats_down = Some((node, at + down));
                Action::KillNatsNode(node)
            }
            Choice::Pause => {
                let from = live
                    .into_iter()
                    .filter(|r| !self.paused.contains(r))
                    .collect();
                let role = pick(rng, from);
                self.paused.insert(role);
                Action::Pause(role)
            }
            Choice::Resume => {
                let role = pick(rng, self.paused.iter().copied().collect());
                self.paused.remove(&role);
                Action::Resume(role)
            }
            Choice::Delete => {
                let from = live
                    .into_iter()
                    .filter(|r| r.deletable() && !self.paused.contains(r))
                    .collect();
                let role = pick(rng, from);
                self.deleted.insert(role);
                Action::Delete(role)
            }
            Choice::Recreate => {
                let role = pick(rng, self.deleted.iter().copied().collect());
                self.deleted.remove(&role);
                if role == Role::Toggle {
                    self.toggle_ordered = false;
                }
                Action::Recreate(role)
            }
            Choice::Edit => Action::Edit(pick(rng, live)),
            Choice::Toggle => {
                self.toggle_ordered = !self.toggle_ordered;
                Action::SetOrdered(Role::Toggle, self.toggle_ordered)
            }
            Choice::Rotate => Action::RotateKeys,
            Choice::Replay => {
                let from = Role::REPLAYED
                    .into_iter()
                    .filter(|r| !self.deleted.contains(r))
                    .collect();
                let role = pick(rng, from);
                self.replays += 1;
                self.replay = Some((self.replays, role));
                Action::Replay(role, self.replays)
            }
            Choice::DeleteReplay => {
                let (n, _) = self.replay.take().expect("a replay to delete");
                Action::DeleteReplay(n)
            }
            Choice::KillOperator => {
                let id = OPERATORS[rng.usize(..OPERATORS.len())].to_owned();
                self.operators_down.insert(id.clone());
                Action::KillOperator(id)
            }
            Choice::StartOperator => {
                let id = pick_id(rng, &self.operators_down);
                self.operators_down.remove(&id);
                Action::StartOperator(id)
            }
            Choice::Blackout => {
                let down = Duration::from_millis(rng.u64(5_000..=15_000));
                self.api_back = at + down;
                Action::BlackoutApi(down)
            }
            Choice::Redeliver => {
                let from = Role::REDELIVERED
                    .into_iter()
                    .filter(|r| !self.deleted.contains(r))
                    .collect();
                Action::Redeliver(pick(rng, from))
            }
            Choice::Steal => {
                self.steal_after = at + STOLEN_FOR;
                Action::StealLease(rng.u32(..shape.shards.max(1)))
            }
        }
    }
}

fn pick_id(rng: &mut fastrand::Rng, from: &BTreeSet<String>) -> String {
    let i = rng.usize(..from.len());
    from.iter()
        .nth(i)
        .expect("an index below the length")
        .clone()
}

/// The schedule as lines a person reads: `+12.3s  kill -9 dispatcher d1`.
pub fn describe(steps: &[Step]) -> String {
    steps
        .iter()
        .map(|s| format!("+{:>6.1}s  {}\n", s.at.as_secs_f64(), s.action))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            length: Duration::from_secs(300),
            max_dispatchers: 3,
            nats_nodes: 3,
            mean_gap: Duration::from_secs(2),
            shards: 4,
            control: false,
        }
    }

    fn control() -> Shape {
        Shape {
            control: true,
            ..shape()
        }
    }

    #[test]
    fn a_seed_reproduces_its_schedule_and_another_seed_does_not() {
        assert_eq!(plan(7, &shape()), plan(7, &shape()));
        assert_ne!(plan(7, &shape()), plan(8, &shape()));
    }

    /// Replayed against a model of its own, every step is possible when it is taken:
    /// no stop of a replica that is not running, at least one replica always running,
    /// at most one NATS node down, no pause of a deleted endpoint; and the schedule ends
    /// with every node up and nothing paused.
    #[test]
    fn every_step_is_possible_when_it_is_taken() {
        for (seed, shape) in (0..200).flat_map(|seed| [(seed, shape()), (seed, control())]) {
            let steps = plan(seed, &shape);
            let mut running = BTreeSet::new();
            let mut down = None;
            let mut paused = BTreeSet::new();
            let mut deleted = BTreeSet::new();
            let mut kinds = std::collections::HashSet::new();
            let mut stolen_at: Option<Duration> = None;
            let mut replay = None;
            let mut operators_down = BTreeSet::new();
            let mut api_back = Duration::ZERO;
            for (i, s) in steps.iter().enumerate() {
                assert!(i == 0 || steps[i - 1].at <= s.at, "seed {seed}: time order");
                kinds.insert(std::mem::discriminant(&s.action));
                match &s.action {
                    Action::StartDispatcher(id) => assert!(running.insert(id.clone())),
                    Action::KillDispatcher(id) | Action::StopDispatcher(id) => {
                        assert!(running.remove(id), "seed {seed}: {id} was not running");
                        assert!(!running.is_empty(), "seed {seed}: no replica left");
                    }
                    Action::KillNatsNode(n) => {
                        assert!(down.is_none(), "seed {seed}: two nodes down");
                        down = Some(*n);
                    }
                    Action::StartNatsNode(n) => assert_eq!(down.take(), Some(*n)),
                    Action::Pause(r) => {
                        assert!(!deleted.contains(r) && paused.insert(*r), "seed {seed}")
                    }
                    Action::Resume(r) => assert!(paused.remove(r), "seed {seed}"),
                    Action::Delete(r) => {
                        assert!(r.deletable() && !paused.contains(r), "seed {seed}");
                        assert!(deleted.insert(*r), "seed {seed}");
                    }
                    Action::Recreate(r) => assert!(deleted.remove(r), "seed {seed}"),
                    Action::Edit(r) | Action::SetOrdered(r, _) => {
                        assert!(!deleted.contains(r), "seed {seed}: {r:?} is deleted")
                    }
                    Action::RotateKeys => {}
                    Action::Replay(r, n) => {
                        assert!(Role::REPLAYED.contains(r) && !deleted.contains(r));
                        assert!(replay.replace(*n).is_none(), "seed {seed}: two replays");
                    }
                    Action::DeleteReplay(n) => assert_eq!(replay.take(), Some(*n)),
                    Action::StealLease(n) => {
                        assert!(*n < 4, "seed {seed}: shard {n}");
                        assert!(
                            stolen_at.is_none_or(|t| s.at >= t + STOLEN_FOR),
                            "seed {seed}: two leases stolen at once"
                        );
                        stolen_at = Some(s.at);
                    }
                    Action::KillOperator(id) => {
                        assert!(shape.control, "seed {seed}: an operator in a data soak");
                        assert!(operators_down.is_empty(), "seed {seed}: both down");
                        operators_down.insert(id.clone());
                    }
                    Action::StartOperator(id) => {
                        assert!(operators_down.remove(id), "seed {seed}: {id} was running")
                    }
                    Action::BlackoutApi(d) => {
                        assert!(shape.control && s.at >= api_back, "seed {seed}: overlap");
                        api_back = s.at + *d;
                    }
                    Action::Redeliver(r) => {
                        assert!(shape.control && Role::REDELIVERED.contains(r));
                        assert!(!deleted.contains(r), "seed {seed}: {r:?} is deleted");
                    }
                }
            }
            assert!(down.is_none() && paused.is_empty(), "seed {seed}: restored");
            assert!(operators_down.is_empty(), "seed {seed}: operators restored");
            assert!(kinds.len() >= 8, "seed {seed}: only {} kinds", kinds.len());
        }
    }

    #[test]
    fn a_single_node_is_never_killed() {
        let single = Shape {
            nats_nodes: 1,
            ..shape()
        };
        assert!(
            plan(3, &single)
                .iter()
                .all(|s| !matches!(s.action, Action::KillNatsNode(_)))
        );
    }
}
