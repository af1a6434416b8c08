//! The forge stats aggregator (spec scope item 8): attempts, approvals, rejections, the sum of
//! approved confidences, unique names attempted, unique names approved, unique terminal
//! rejections (names attempted but never approved) and the rejection histogram.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::classify::RejectionCategory;

/// A snapshot of the aggregate (the TS `ForgeStats`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct ForgeStats {
    pub attempts: u64,
    pub approved: u64,
    pub rejected: u64,
    pub approved_confidence_sum: f64,
    pub unique_names: u64,
    pub unique_approved: u64,
    pub unique_terminal_rejections: u64,
    /// Every category, zero included.
    #[cfg_attr(feature = "wasm-core", tsify(type = "Record<RejectionCategory, number>"))]
    pub rejections_by_category: BTreeMap<String, u64>,
}

/// Accumulates forge outcomes.
///
/// Serializing it writes the counters and the histogram only: the name sets grow with every
/// new name, so the registry persists each name once, when it changes (see `record_*`), and
/// hands them back with [`ForgeStatsAggregator::restore_name`]. Records written before that
/// split still carry the sets; they are read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForgeStatsAggregator {
    attempts: u64,
    approved: u64,
    rejected: u64,
    approved_confidence_sum: f64,
    #[serde(default, skip_serializing)]
    names: BTreeSet<String>,
    #[serde(default, skip_serializing)]
    approved_names: BTreeSet<String>,
    histogram: BTreeMap<RejectionCategory, u64>,
}

impl ForgeStatsAggregator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an approved attempt for `name` with the verdict's confidence. Returns whether
    /// this is the name's first approval.
    pub fn record_approved(&mut self, name: &str, confidence: f64) -> bool {
        self.attempts += 1;
        self.approved += 1;
        self.approved_confidence_sum += confidence;
        self.names.insert(name.to_string());
        self.approved_names.insert(name.to_string())
    }

    /// Records a rejected attempt for `name` (which may be empty when the request did not
    /// even name a tool). Returns whether the name is new.
    pub fn record_rejected(&mut self, name: &str, category: RejectionCategory) -> bool {
        self.attempts += 1;
        self.rejected += 1;
        *self.histogram.entry(category).or_default() += 1;
        !name.is_empty() && self.names.insert(name.to_string())
    }

    /// Puts back a name read from the store (`approved`: it has been approved at least once).
    pub fn restore_name(&mut self, name: &str, approved: bool) {
        self.names.insert(name.to_string());
        if approved {
            self.approved_names.insert(name.to_string());
        }
    }

    /// Whether `name` has been approved at least once.
    pub fn name_approved(&self, name: &str) -> bool {
        self.approved_names.contains(name)
    }

    /// Every name attempted, with whether it has been approved at least once.
    pub fn names(&self) -> impl Iterator<Item = (&str, bool)> + '_ {
        self.names.iter().map(|name| (name.as_str(), self.name_approved(name)))
    }

    /// The current numbers.
    pub fn snapshot(&self) -> ForgeStats {
        ForgeStats {
            attempts: self.attempts,
            approved: self.approved,
            rejected: self.rejected,
            approved_confidence_sum: self.approved_confidence_sum,
            unique_names: self.names.len() as u64,
            unique_approved: self.approved_names.len() as u64,
            unique_terminal_rejections: self.names.difference(&self.approved_names).count() as u64,
            rejections_by_category: RejectionCategory::ALL.iter().map(|c| (c.as_str().to_string(), self.histogram.get(c).copied().unwrap_or(0))).collect(),
        }
    }
}
