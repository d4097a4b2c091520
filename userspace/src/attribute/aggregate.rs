//! Aggregations of thread energy by process, cgroup and command, with sample counts and
//! 95% confidence intervals ([`super::ci`]).

use std::collections::{BTreeMap, HashSet};

use super::attribution::{Attribution, PerDomain, ThreadEnergy};
use super::ci::{Estimate, estimate_samples};
use super::split::ThreadKey;

/// What a group is keyed by.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupKey {
    /// A process (tgid).
    Process(u32),
    /// A cgroup v2 id (0: unknown).
    Cgroup(u64),
    /// A command name.
    Comm(String),
}

/// Energy of a group of threads.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The key.
    pub key: GroupKey,
    /// Display name: the process's main-thread comm, the cgroup id, or the comm.
    pub name: String,
    /// Threads in the group.
    pub threads: usize,
    /// On-CPU time, ns.
    pub cpu_ns: u64,
    /// Energy per domain, µJ.
    pub energy: PerDomain,
    /// Part of `energy` no stack sample carries, µJ.
    pub no_stack: PerDomain,
    /// Headline energy with its 95% interval and sample count.
    pub estimate: Estimate,
    /// Share of the measured headline energy, 0..1.
    pub share: f64,
}

/// Groups by process.
pub fn by_process(attr: &Attribution) -> Vec<Group> {
    group_by(attr, |t| GroupKey::Process(t.tgid))
}

/// Groups by cgroup.
pub fn by_cgroup(attr: &Attribution) -> Vec<Group> {
    group_by(attr, |t| GroupKey::Cgroup(t.cgroup_id))
}

/// Groups by command name (threads with no known name are grouped under "").
pub fn by_comm(attr: &Attribution) -> Vec<Group> {
    group_by(attr, |t| GroupKey::Comm(t.comm.clone()))
}

fn group_by(attr: &Attribution, key: impl Fn(&ThreadEnergy) -> GroupKey) -> Vec<Group> {
    let mut members: BTreeMap<GroupKey, Vec<&ThreadEnergy>> = BTreeMap::new();
    for t in &attr.threads {
        members.entry(key(t)).or_default().push(t);
    }
    let total = attr.total_uj();
    let mut groups: Vec<Group> = members
        .into_iter()
        .map(|(key, threads)| {
            let mut energy = PerDomain::default();
            let mut no_stack = PerDomain::default();
            for t in &threads {
                energy.add_all(&t.energy);
                no_stack.add_all(&t.no_stack);
            }
            let set: HashSet<ThreadKey> = threads.iter().map(|t| (t.tgid, t.tid)).collect();
            let estimate = estimate_samples(attr, &attr.headline, |i| {
                set.contains(&attr.sample_thread[i])
            })
            .plus_exact(attr.headline_uj(&no_stack));
            let name = match &key {
                GroupKey::Process(tgid) => threads
                    .iter()
                    .find(|t| t.tid == *tgid)
                    .or(threads.first())
                    .map(|t| t.comm.clone())
                    .unwrap_or_default(),
                GroupKey::Cgroup(id) => id.to_string(),
                GroupKey::Comm(c) => c.clone(),
            };
            Group {
                name,
                threads: threads.len(),
                cpu_ns: threads.iter().map(|t| t.cpu_ns).sum(),
                share: if total > 0.0 {
                    attr.headline_uj(&energy) / total
                } else {
                    0.0
                },
                energy,
                no_stack,
                estimate,
                key,
            }
        })
        .collect();
    groups.sort_by(|a, b| {
        b.estimate
            .energy_uj
            .total_cmp(&a.estimate.energy_uj)
            .then(a.key.cmp(&b.key))
    });
    groups
}
