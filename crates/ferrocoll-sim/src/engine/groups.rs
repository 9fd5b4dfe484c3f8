//! The input of a run: the [`Group`]s of ranks and where their [`Plans`]
//! come from.

use std::borrow::Cow;

use ferrocoll::plan::Plan;

/// The plans of one group of ranks for [`run_groups`](super::run_groups).
#[derive(Clone, Copy)]
pub struct Group<'a> {
    /// Group rank i's plan; peers in it are group ranks.
    pub plans: Plans<'a>,
    /// `ranks[i]` is the physical rank (the network's) group rank i runs
    /// on; as many as `plans`, distinct.
    pub ranks: &'a [usize],
}

/// Where a group's plans come from.
#[derive(Clone, Copy)]
pub enum Plans<'a> {
    /// Built already: `plans[i]` is group rank i's.
    Given(&'a [Plan]),
    /// Built one at a time while the engine reads them, and dropped once
    /// read: the engine keeps only what it needs of each (peers, sizes,
    /// reductions), a fraction of a plan's memory (a 4,096-rank ring
    /// allreduce: 34 million rounds).
    Built {
        /// How many ranks.
        count: usize,
        /// Builds group rank i's plan.
        build: &'a dyn Fn(usize) -> Result<Plan, String>,
    },
}

impl<'a> Plans<'a> {
    /// How many plans.
    pub fn len(&self) -> usize {
        match self {
            Plans::Given(p) => p.len(),
            Plans::Built { count, .. } => *count,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Group rank i's plan.
    pub(crate) fn get(&self, i: usize) -> Result<Cow<'a, Plan>, String> {
        match self {
            Plans::Given(p) => Ok(Cow::Borrowed(&p[i])),
            Plans::Built { build, .. } => build(i).map(Cow::Owned),
        }
    }
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("plans", &self.plans.len())
            .field("ranks", &self.ranks)
            .finish()
    }
}
