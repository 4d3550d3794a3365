//! Consumer groups: membership, round-robin assignment, the generation
//! counter, cooperative revocation and the group's stored offsets.
//!
//! Members are keyed by the request header's `client` id; the consumer's
//! name plays no part. Partition `p` belongs to member `p % n`, counting
//! members by the order they joined. If rebalancing would take a partition
//! from a member whose last served offset is ahead of the group's stored
//! offset, the handover is cooperative. The current owner is fenced off
//! immediately, and the incoming owner waits until either an offset store
//! reaches the last served offset or the rebalancing timeout expires. The
//! real server performs that step in the background, shortly after the
//! store; this server performs it synchronously as part of the store.

use iggy_binary_protocol::WireName;
use iggy_binary_protocol::responses::consumer_groups::{
    ConsumerGroupDetailsResponse, ConsumerGroupMemberResponse, ConsumerGroupResponse,
};
use std::time::{Duration, Instant};

struct Member {
    client: u128,
    id: u32,
}

struct Revocation {
    from: u128,
    to: u128,
    /// Highest offset the old owner was served; a store at or past it frees
    /// the partition.
    covers: u64,
    since: Instant,
}

pub(crate) struct Group {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) generation: u64,
    members: Vec<Member>,
    next_member_id: u32,
    owners: Vec<Option<u128>>,
    pending: Vec<Option<Revocation>>,
    /// Highest offset served to the current owner of each partition.
    served: Vec<Option<u64>>,
    /// The group's stored offset per partition; it outlives every member.
    pub(crate) offsets: Vec<Option<u64>>,
}

impl Group {
    pub(crate) fn new(id: u32, name: String, partitions: usize) -> Self {
        Self {
            id,
            name,
            generation: 0,
            members: Vec::new(),
            next_member_id: 0,
            owners: vec![None; partitions],
            pending: (0..partitions).map(|_| None).collect(),
            served: vec![None; partitions],
            offsets: vec![None; partitions],
        }
    }

    /// The topic grew by `count` partitions: they join the round robin.
    pub(crate) fn add_partitions(&mut self, count: usize) {
        for _ in 0..count {
            self.owners.push(None);
            self.pending.push(None);
            self.served.push(None);
            self.offsets.push(None);
        }
        self.rebalance();
    }

    pub(crate) fn members_count(&self) -> usize {
        self.members.len()
    }

    pub(crate) fn is_member(&self, client: u128) -> bool {
        self.members.iter().any(|member| member.client == client)
    }

    pub(crate) fn owns(&self, client: u128, partition: u32) -> bool {
        self.owners.get(partition as usize) == Some(&Some(client))
    }

    /// Partitions assigned to `client`, ascending.
    pub(crate) fn assignment(&self, client: u128) -> Vec<u32> {
        (0..self.owners.len())
            .filter(|&p| self.owners[p] == Some(client))
            .map(|p| u32::try_from(p).expect("partition ids are u32"))
            .collect()
    }

    /// Adds `client` as a member; `false` when it already was one (a repeated
    /// join changes nothing, not even the generation).
    pub(crate) fn join(&mut self, client: u128) -> bool {
        if self.is_member(client) {
            return false;
        }
        self.members.push(Member {
            client,
            id: self.next_member_id,
        });
        self.next_member_id += 1;
        self.rebalance();
        true
    }

    /// Removes `client`; `false` when it was not a member.
    pub(crate) fn leave(&mut self, client: u128) -> bool {
        let before = self.members.len();
        self.members.retain(|member| member.client != client);
        if self.members.len() == before {
            return false;
        }
        self.rebalance();
        true
    }

    /// Records that the owner of `partition` was served messages up to `last`.
    pub(crate) fn record_served(&mut self, partition: u32, last: u64) {
        if let Some(served) = self.served.get_mut(partition as usize) {
            *served = Some(served.map_or(last, |previous| previous.max(last)));
        }
    }

    /// Stores the group offset of `partition`, completing a revocation the
    /// store covers.
    pub(crate) fn store_offset(&mut self, partition: u32, offset: u64) {
        let p = partition as usize;
        self.offsets[p] = Some(offset);
        if self.pending[p]
            .as_ref()
            .is_some_and(|revocation| offset >= revocation.covers)
        {
            self.complete_revocation(p);
        }
    }

    /// Hands over every revocation older than `timeout`.
    pub(crate) fn expire_revocations(&mut self, now: Instant, timeout: Duration) {
        for p in 0..self.pending.len() {
            if self.pending[p]
                .as_ref()
                .is_some_and(|revocation| now.duration_since(revocation.since) >= timeout)
            {
                self.complete_revocation(p);
            }
        }
    }

    pub(crate) fn details(&self) -> ConsumerGroupDetailsResponse {
        let members = self
            .members
            .iter()
            .map(|member| {
                let partitions = self.assignment(member.client);
                ConsumerGroupMemberResponse {
                    id: member.id,
                    partitions_count: u32::try_from(partitions.len()).expect("u32 partitions"),
                    partitions,
                }
            })
            .collect::<Vec<_>>();
        ConsumerGroupDetailsResponse {
            group: ConsumerGroupResponse {
                id: self.id,
                partitions_count: u32::try_from(self.owners.len()).expect("u32 partitions"),
                members_count: u32::try_from(members.len()).expect("u32 members"),
                name: WireName::new(self.name.clone()).expect("group names are valid"),
            },
            members,
        }
    }

    fn complete_revocation(&mut self, p: usize) {
        if let Some(revocation) = self.pending[p].take() {
            self.owners[p] = Some(revocation.to);
            self.served[p] = None;
            self.generation += 1;
        }
    }

    fn uncommitted(&self, p: usize) -> bool {
        match (self.served[p], self.offsets[p]) {
            (Some(served), Some(stored)) => served > stored,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// Recomputes the round-robin target of every partition after a
    /// membership change and moves partitions towards it.
    fn rebalance(&mut self) {
        let now = Instant::now();
        let count = self.members.len();
        for p in 0..self.owners.len() {
            let target = (count > 0).then(|| self.members[p % count].client);
            if let Some(mut revocation) = self.pending[p].take() {
                let from_is_member = self.is_member(revocation.from);
                match target {
                    // The old owner is the target again: it keeps the partition.
                    Some(target) if target == revocation.from => {
                        self.served[p] = Some(revocation.covers);
                        self.owners[p] = Some(target);
                    }
                    Some(target) if from_is_member => {
                        revocation.to = target;
                        self.pending[p] = Some(revocation);
                    }
                    // The old owner is gone: nobody is left to wait for.
                    _ => {
                        self.owners[p] = target;
                        self.served[p] = None;
                    }
                }
                continue;
            }
            if self.owners[p] == target {
                continue;
            }
            match (self.owners[p], target) {
                (Some(old), Some(new)) if self.is_member(old) && self.uncommitted(p) => {
                    self.pending[p] = Some(Revocation {
                        from: old,
                        to: new,
                        covers: self.served[p].unwrap_or_default(),
                        since: now,
                    });
                    self.owners[p] = None;
                }
                _ => self.owners[p] = target,
            }
            self.served[p] = None;
        }
        self.generation += 1;
    }
}
