//! Tool names: how they are compared ([`canonical_tool_name`]), the agent's own tools a forged
//! tool may neither take nor resemble, look-alikes across tiers, and pipeline steps an own tool
//! shadows.

use std::collections::{BTreeMap, HashMap};

use crate::forge::{ForgeRequest, FORGE_TOOL_NAME};
use crate::tools::{ToolFailure, ToolSet};

use super::{Entry, Registry, RegistryError, State, Tier};

impl Registry {
    /// Whether `name` is one of the agent's own tools. No forged tool stands in for one: a
    /// forged tool stored under its name (from before forging such names was refused, or
    /// before the own tool was added) is reached nowhere.
    pub(super) fn is_own(&self, name: &str) -> bool {
        // The exact name first: every call of a host tool asks, and it needs no folding.
        self.host_tools.borrow().contains(name) || self.own_look_alike(name).is_some()
    }

    /// The own tool (host tool or `forge_tool`) whose name `name` is or folds onto (see
    /// [`canonical_tool_name`]).
    pub(super) fn own_look_alike(&self, name: &str) -> Option<String> {
        let own = self.own_names.borrow();
        match is_canonical_name(name) {
            true => own.get(name).cloned(),
            false => own.get(&canonical_tool_name(name)).cloned(),
        }
    }

    /// The step tool of the compose entry `name` at `tier` that an own tool of this agent
    /// shadows, with that own tool. A step naming a tool forged at the pipeline's tier or above
    /// was tested, judged and approved calling that forged tool (where the pipeline was made);
    /// here the name reaches the own tool instead, so the pipeline would do what nobody
    /// reviewed (a real `send_email` behind a pipeline approved over a draft formatter). Such a
    /// pipeline is neither offered nor run here. A step naming a tool no tier holds forged is
    /// bound to the own tool, as documented.
    pub(super) fn shadowed_step(&self, tier: Tier, name: &str, session: &str) -> Option<(String, String)> {
        let state = self.state.borrow();
        let entry = state.entry(tier, session, name)?;
        let crate::forge::Implementation::Compose { steps } = &entry.record.current.request.implementation else { return None };
        shadowed_in(&state, steps, tier, session, |step| self.own_look_alike(step))
    }

    /// The forged tool of a more specific tier than `tier` that `session` reaches under a name
    /// folding onto `name` but not the same (see [`canonical_tool_name`]): the entry `name` at
    /// `tier` is then not reached here. Forging refuses such a pair, but a tool can arrive
    /// above one later: another agent's shared approval, which the approver could not check
    /// against this agent's own tools, would offer `Report` beside this agent's `report`, and
    /// a call of the look-alike would run the other agent's code on this agent's data.
    pub(super) fn look_alike_below(&self, tier: Tier, name: &str, session: &str) -> Option<String> {
        let state = self.state.borrow();
        [Tier::Session, Tier::Agent]
            .into_iter()
            .filter(|below| *below < tier)
            .filter_map(|below| state.tier(below, session))
            .find_map(|entries| look_alike_in(entries, name))
            .cloned()
    }

    /// Refuses to act on the forged tool stored under one of the agent's own tools' names
    /// ([`RegistryError::OwnTool`]): `export`, `demote` and `rollback` act on what the agent
    /// serves under a name, and it serves its own tool (see [`Registry::is_own`]).
    pub(crate) fn refuse_own_tool(&self, name: &str) -> Result<(), RegistryError> {
        let own = match self.host_tools.borrow().contains(name) {
            true => Some(name.to_string()),
            false => self.own_look_alike(name),
        };
        match own {
            Some(own) => Err(RegistryError::OwnTool { name: name.into(), own }),
            None => Ok(()),
        }
    }

    /// Refuses a forged tool under one of the agent's own tools' names (see [`Registry::is_own`]).
    pub(crate) fn refuse_own_name(&self, name: &str) -> Result<(), String> {
        if self.host_tools.borrow().contains(name) || name == FORGE_TOOL_NAME {
            return Err(format!("`{name}` is one of the agent's own tools; a forged tool needs a name of its own"));
        }
        match self.own_look_alike(name) {
            Some(own) => Err(format!(
                "`{name}` is too close to `{own}`, one of the agent's own tools (names are compared ignoring case and `-` vs `_`); a forged tool needs a name of its own"
            )),
            None => Ok(()),
        }
    }

    /// Refuses a new forged tool `name` that folds onto another forged tool `session` reaches
    /// (`Slugify` beside `slugify`): the model would be offered two tools it cannot tell apart,
    /// and a caller meaning one would get the other. A new version keeps the exact name.
    pub(super) fn refuse_close_name(&self, state: &State, session: &str, name: &str) -> Result<(), String> {
        let mut reached = [Tier::Session, Tier::Agent, Tier::Shared].into_iter().filter_map(|t| state.tier(t, session)).flat_map(|m| m.values());
        match reached.find(|e| e.active() && e.record.name != name && same_tool_name(&e.record.name, name)) {
            Some(e) => Err(format!(
                "`{name}` is too close to the existing tool `{other}` (names are compared ignoring case and `-` vs `_`): forge it as `{other}` for a new version of that tool, or give it a name of its own",
                other = e.record.name
            )),
            None => Ok(()),
        }
    }

    /// Refuses a pipeline over a step tool this agent's own tool shadows here (see
    /// [`Registry::shadowed_step`]): registered, it could not be called.
    pub(super) fn refuse_shadowed_steps(&self, state: &State, session: &str, req: &ForgeRequest) -> Result<(), String> {
        let crate::forge::Implementation::Compose { steps } = &req.implementation else { return Ok(()) };
        match shadowed_in(state, steps, Tier::Session, session, |step| self.own_look_alike(step)) {
            Some((step, own)) => Err(format!(
                "step tool `{step}` is a forged tool this agent cannot reach: its own tool `{own}` shadows it, and a pipeline over it would not be run here"
            )),
            None => Ok(()),
        }
    }
}

/// The form tool names are compared in: ASCII lowercase, `-` read as `_`. A model, like a
/// person reading a tool list, takes `Send-Email` or `REFUND` for `send_email` or `refund`:
/// names that fold alike must not stand for two different tools of one agent.
pub fn canonical_tool_name(name: &str) -> String {
    name.chars().map(|c| if c == '-' { '_' } else { c.to_ascii_lowercase() }).collect()
}

/// One byte of a name as [`canonical_tool_name`] folds it. Byte-wise is exact: the folding
/// touches ASCII only, and a name's other bytes (UTF-8) are left as they are.
fn fold_name_byte(b: u8) -> u8 {
    if b == b'-' {
        b'_'
    } else {
        b.to_ascii_lowercase()
    }
}

/// Whether `name` is its own [`canonical_tool_name`] (most names are): looked up as it is,
/// without building the folded copy.
fn is_canonical_name(name: &str) -> bool {
    !name.bytes().any(|b| b == b'-' || b.is_ascii_uppercase())
}

/// Whether two tool names fold alike (see [`canonical_tool_name`]), without allocating: it is
/// asked of every tool a session reaches at each forge.
pub fn same_tool_name(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| fold_name_byte(x) == fold_name_byte(y))
}

/// The active tool of `entries` whose name folds onto `name` but is not `name` (see
/// [`canonical_tool_name`]).
pub(crate) fn look_alike_in<'e>(entries: &'e BTreeMap<String, Entry>, name: &str) -> Option<&'e String> {
    entries.iter().find(|(other, entry)| other.as_str() != name && entry.active() && same_tool_name(other, name)).map(|(other, _)| other)
}

/// The agent's own tool names (host tools and `forge_tool`), each under its canonical form.
/// `forge_tool` is always in: it names the meta-tool whenever emergent is enabled.
pub(super) fn own_names(host: &ToolSet) -> HashMap<String, String> {
    host.names().chain([FORGE_TOOL_NAME]).map(|n| (canonical_tool_name(n), n.to_string())).collect()
}

/// The first step tool of `steps` that an own tool shadows (`own_of` gives the own tool a
/// name folds onto) while `state` holds a forged tool of that name at `tier` or above, with
/// that own tool. See [`Registry::shadowed_step`].
fn shadowed_in(
    state: &State,
    steps: &[crate::forge::ComposeStep],
    tier: Tier,
    session: &str,
    own_of: impl Fn(&str) -> Option<String>,
) -> Option<(String, String)> {
    steps.iter().find_map(|step| {
        let own = own_of(&step.tool)?;
        let forged = [Tier::Session, Tier::Agent, Tier::Shared].into_iter().filter(|t| *t >= tier).any(|t| state.entry(t, session, &step.tool).is_some());
        forged.then(|| (step.tool.clone(), own))
    })
}

/// The failure of a call of the pipeline `name` whose step tool `step` is shadowed here by the
/// own tool `own` (see [`Registry::shadowed_step`]).
pub(super) fn shadowed_failure(name: &str, step: &str, own: &str) -> ToolFailure {
    ToolFailure::new(
        "denied",
        format!(
            "`{name}` cannot be called by this agent: its step tool `{step}` is a forged tool, which this agent's own tool `{own}` shadows here (the pipeline was tested and approved over the forged one)"
        ),
    )
}
