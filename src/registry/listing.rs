//! The listed view of the registry's tools ([`ToolInfo`]).

use super::{restorable, Entry, Registry, Tier, ToolInfo};

impl Registry {
    /// Every registered tool `session` can see, demoted tombstones included (session tier
    /// first, then agent, then shared); not one stored under an own tool's name, which nothing
    /// reaches (see [`Registry::is_own`]).
    pub fn list(&self, session: &str) -> Vec<ToolInfo> {
        let state = self.state.borrow();
        [Tier::Session, Tier::Agent, Tier::Shared]
            .into_iter()
            .filter_map(|t| state.tier(t, session))
            .flat_map(|m| m.values().filter(|e| !self.is_own(&e.record.name)).map(|e| self.listed(e)))
            .collect()
    }

    /// `entry` as this agent lists it: another agent's shared tool without the session it was
    /// forged in (that agent's, a tenant's maybe; see `provenance` in the package module).
    fn listed(&self, entry: &Entry) -> ToolInfo {
        let mut info = tool_info(entry);
        if entry.record.origin.agent_id != self.agent_id {
            info.session_id = None;
        }
        info
    }
}

/// The listed view of an entry.
pub(crate) fn tool_info(entry: &Entry) -> ToolInfo {
    let r = &entry.record;
    let req = &r.current.request;
    ToolInfo {
        name: r.name.clone(),
        description: req.description.clone(),
        tier: r.tier,
        version: r.current.version,
        hash: r.current.hash.clone(),
        mode: req.implementation.mode().to_string(),
        input_schema: req.input_schema.clone(),
        output_schema: req.output_schema.clone(),
        implementation: Some(req.implementation.clone()),
        stats: entry.stats.clone(),
        verdict: r.current.verdict.clone(),
        session_id: r.session_id.clone(),
        created_at: r.current.created_at,
        versions: r.history.iter().map(|v| v.version).collect(),
        restorable_versions: r.history.iter().filter(|v| restorable(v, r.tier)).map(|v| v.version).collect(),
        status: r.status,
    }
}
