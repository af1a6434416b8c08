//! The tools a session is offered and calls: tool sets, resolution across the tiers, forged
//! tools built on first use, and calls made through the registry API.

use std::collections::BTreeSet;
use std::rc::{Rc, Weak};

use serde_json::Value;

use crate::forge::{ForgeToolHandler, FORGE_TOOL_NAME};
use crate::tools::{invoke, CallContext, Nesting, Tool, ToolFailure, ToolSet};

use super::{provider, shadowed_failure, Registry, Tier, ToolStatus};

impl Registry {
    /// The tools a run of `session` sees: host tools, then shared, agent and session tiers
    /// (the more specific tier wins a name), plus `forge_tool` when emergent is enabled.
    /// Demoted entries are left out, and so are compose tools whose step tools the session
    /// does not reach now.
    pub fn tool_set(&self, session: &str) -> ToolSet {
        let mut set = self.host_tools.borrow().clone();
        for name in self.forged_names(session) {
            if let Some((_, tool)) = self.offered(&name, session) {
                set.insert(tool);
            }
        }
        if self.config.enabled {
            if let Some(tool) = self.forge_tool() {
                set.insert(tool);
            }
        }
        set
    }

    /// The names of the active forged tools `session` sees at some tier, each once.
    fn forged_names(&self, session: &str) -> BTreeSet<String> {
        let state = self.state.borrow();
        [Tier::Shared, Tier::Agent, Tier::Session]
            .into_iter()
            .filter_map(|t| state.tier(t, session))
            .flat_map(|m| m.values().filter(|e| e.active()).map(|e| e.record.name.clone()))
            .collect()
    }

    /// The forged tool a run of `session` is offered under `name`, with its tier: the most
    /// specific tier's that builds, when its pipeline's steps are reachable now.
    pub(super) fn offered(&self, name: &str, session: &str) -> Option<(Tier, Tool)> {
        let (tier, tool) = self.forged_tool(name, session)?;
        self.steps_reachable(tier, name, session).then_some((tier, tool))
    }

    /// The tools compose pipelines reach, resolved per call for the caller's session.
    pub(crate) fn lookup(&self) -> Rc<dyn crate::tools::ToolLookup> {
        Rc::new(RegistryTools(self.me.clone()))
    }

    /// The tool `session` reaches under `name`: forged (session, agent, shared), then host
    /// tools, then `forge_tool`. Only that tool is built (and cached on its entry).
    pub fn resolve_tool(&self, name: &str, session: &str) -> Option<Tool> {
        if let Some((_, tool)) = self.forged_tool(name, session) {
            return Some(tool);
        }
        if let Some(tool) = self.host_tools.borrow().get(name) {
            return Some(tool.clone());
        }
        (self.config.enabled && name == FORGE_TOOL_NAME).then(|| self.forge_tool()).flatten()
    }

    /// The names of the tools `session` reaches (host tools, forged tools whose pipeline steps
    /// it reaches, `forge_tool`), found without building any, unlike [`Registry::tool_set`]: a
    /// compose build that fails names what is available, and building the tool set for that
    /// built the failing pipeline again, which failed the same way, until the stack ran out (a
    /// trap in wasm, for every agent of the instance).
    fn reachable_names(&self, session: &str) -> Vec<String> {
        let mut names: Vec<String> = self.forged_names(session).into_iter().collect();
        names.retain(|name| {
            let tier = self.state.borrow().resolve(name, session).map(|(tier, _)| tier);
            !self.is_own(name) && tier.is_some_and(|tier| self.steps_reachable(tier, name, session) && self.look_alike_below(tier, name, session).is_none())
        });
        names.extend(self.host_tools.borrow().names().map(str::to_string));
        if self.config.enabled {
            names.push(FORGE_TOOL_NAME.to_string());
        }
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Whether `session` reaches a tool `name`, without building anything.
    fn reaches(&self, name: &str, session: &str) -> bool {
        let forged = self.state.borrow().resolve(name, session).map(|(tier, _)| tier);
        // A pipeline over a step this agent's own tool shadows is not run here: one calling it
        // is not offered either.
        forged.is_some_and(|tier| self.shadowed_step(tier, name, session).is_none() && self.look_alike_below(tier, name, session).is_none())
            || self.host_tools.borrow().contains(name)
            || (self.config.enabled && name == FORGE_TOOL_NAME)
    }

    /// The built forged tool `session` reaches under `name` (the most specific tier that
    /// builds), with its tier; none under an own tool's name (see [`Registry::is_own`]).
    fn forged_tool(&self, name: &str, session: &str) -> Option<(Tier, Tool)> {
        if self.is_own(name) {
            return None;
        }
        // The look-alike scan only for the tier that holds the tool: a call of a shared tool
        // would otherwise walk the session's tools for the agent tier too.
        [Tier::Session, Tier::Agent, Tier::Shared]
            .into_iter()
            .filter(|tier| self.shadowed_step(*tier, name, session).is_none())
            .find_map(|tier| self.built_at(tier, name, session).filter(|_| self.look_alike_below(tier, name, session).is_none()).map(|tool| (tier, tool)))
    }

    /// Whether every step tool of the compose entry `name` at `tier` is reachable by `session`
    /// now (true for sandbox tools).
    fn steps_reachable(&self, tier: Tier, name: &str, session: &str) -> bool {
        if self.shadowed_step(tier, name, session).is_some() {
            return false;
        }
        let state = self.state.borrow();
        let Some(entry) = state.entry(tier, session, name) else { return false };
        match &entry.record.current.request.implementation {
            crate::forge::Implementation::Compose { steps } => steps.iter().all(|step| self.reaches(&step.tool, session)),
            _ => true,
        }
    }

    /// The built tool of the active entry `name` at `tier`, building and caching it on first
    /// use; `None` when there is none or it cannot be built now.
    fn built_at(&self, tier: Tier, name: &str, session: &str) -> Option<Tool> {
        let record = {
            let state = self.state.borrow();
            let entry = state.entry(tier, session, name).filter(|e| e.active())?;
            if let Some(tool) = &entry.built {
                return Some(tool.clone());
            }
            entry.record.clone()
        };
        let inner = self.forge.build(&record.current.request, &self.lookup(), session).ok()?;
        let tool = provider::tracked(inner, self.me.clone(), tier, session, &record.current.hash)?;
        if let Some(entry) = self.state.borrow_mut().entry_mut(tier, session, name) {
            if entry.record.current.hash == record.current.hash {
                entry.built = Some(tool.clone());
            }
        }
        Some(tool)
    }

    /// The `forge_tool` meta-tool, built once (it never changes for a registry).
    fn forge_tool(&self) -> Option<Tool> {
        if let Some(tool) = self.forge_tool.borrow().as_ref() {
            return Some(tool.clone());
        }
        // Any arguments reach the handler, even text that is not JSON: the forge normalizes
        // what it can and rejects the rest with a category, counted in the forge stats (a
        // schema check here would bounce the synonyms `normalize` accepts with a bare
        // `invalid_arguments`). The model sees one concrete argument shape.
        let tool =
            Tool::new(FORGE_TOOL_NAME, crate::forge::forge_tool_description(), &serde_json::json!({}), None, Rc::new(ForgeToolHandler::new(self.me.clone())))
                .ok()?
                .advertising(crate::forge::forge_tool_advertised_schema());
        *self.forge_tool.borrow_mut() = Some(tool.clone());
        Some(tool)
    }

    /// Calls the tool `name` as a run of `session` would reach it (session, agent, shared,
    /// then host tools). Arguments and output are checked against the schemas; an output
    /// that violates the output schema is an `invalid_output` failure, never a success.
    pub async fn call(&self, name: &str, args: Value, session: &str) -> Result<Value, ToolFailure> {
        self.call_as(name, args, session, "", Nesting::default()).await
    }

    /// [`Registry::call`] whose handlers get `run_id` as their run id (a direct call has no
    /// run; the host may give it an id by which its tool adapters find the call's abort signal).
    ///
    /// `nesting` is what the call continues (see [`Nesting`]): a host tool that calls a forged
    /// tool back while a pipeline runs it (before its first await, on the same stack) passes
    /// its own, so a pipeline reaching itself that way meets the nesting and step limits, not
    /// the end of the stack, and a test's re-entry is no use of the tools it reaches.
    pub async fn call_as(&self, name: &str, args: Value, session: &str, run_id: &str, nesting: Nesting) -> Result<Value, ToolFailure> {
        let Some(tool) = self.resolve_tool(name, session) else {
            if let Some(failure) = self.unreached_here(name, session) {
                return Err(failure);
            }
            let (active, demoted) = {
                let state = self.state.borrow();
                let active = state.resolve(name, session).map(|(_, e)| e.record.current.request.clone());
                (active, [Tier::Session, Tier::Agent, Tier::Shared].into_iter().any(|t| state.entry(t, session, name).is_some()))
            };
            // Registered and active, but it does not build for this session (a tool its
            // pipeline calls is gone): the build's own reason says which.
            if let Some(request) = active {
                let reason =
                    self.forge.build(&request, &self.lookup(), session).err().map_or_else(|| "it cannot be built now".to_string(), |(reason, _)| reason);
                return Err(ToolFailure::new("unknown_tool", format!("`{name}` cannot be called by this session: {reason}")));
            }
            // A forge makes "Count Vowels" the tool `Count_Vowels`: a caller using the name as
            // it was asked for is told the name it got.
            let registered = crate::forge::snake_name(name);
            let hint = if registered != name && self.resolve_tool(&registered, session).is_some() {
                format!(" (forged tools are named `{registered}` for `{name}`: call it by that name)")
            } else {
                String::new()
            };
            return Err(if demoted {
                ToolFailure::new("denied", format!("`{name}` is demoted and cannot be called at its old tier"))
            } else {
                ToolFailure::new("unknown_tool", format!("no tool named `{name}`{hint}"))
            });
        };
        // A host tool that asks for approval is asked for it in runs only; a direct call
        // (`agent.tools.call`) has no one to ask, so it is refused rather than let through.
        if tool.handler().needs_approval(&args).await {
            return Err(crate::forge::denied_without_approval(name));
        }
        let Nesting { depth, trial, pipeline_budget } = nesting;
        invoke(&tool, args, &CallContext { depth, trial, pipeline_budget, ..self.direct_call(session, run_id) }).await
    }

    /// Why the forged tool `session` holds under `name` is not reached by this agent, when
    /// its name folds onto an own tool's or a step of it is shadowed by one: said as such,
    /// not as a build failure or a missing tool.
    fn unreached_here(&self, name: &str, session: &str) -> Option<ToolFailure> {
        let tier = self.state.borrow().resolve(name, session).map(|(tier, _)| tier)?;
        if let Some(own) = self.own_look_alike(name) {
            return Some(ToolFailure::new(
                "unknown_tool",
                format!("no tool named `{name}`: the forged tool of that name is too close to this agent's own tool `{own}` to be reached here (did you mean `{own}`?)"),
            ));
        }
        if let Some(own) = self.look_alike_below(tier, name, session) {
            return Some(ToolFailure::new(
                "unknown_tool",
                format!(
                    "no tool named `{name}`: the {} tool of that name is too close to this session's `{own}` to be reached here (did you mean `{own}`?)",
                    tier.as_str()
                ),
            ));
        }
        self.shadowed_step(tier, name, session).map(|(step, own)| shadowed_failure(name, &step, &own))
    }

    /// The context of a call made through the registry API, outside any run.
    fn direct_call(&self, session: &str, run_id: &str) -> CallContext {
        CallContext { direct: true, ..CallContext::new(run_id, self.env.new_id("call"), session) }
    }

    /// Calls `name` at exactly `tier`: fails with `denied` when the tool there is demoted.
    pub async fn call_at(&self, name: &str, tier: Tier, args: Value, session: &str) -> Result<Value, ToolFailure> {
        let status = self.state.borrow().entry(tier, session, name).map(|e| e.record.status);
        match status {
            None => Err(ToolFailure::new("unknown_tool", format!("no tool named `{name}` at the {} tier", tier.as_str()))),
            Some(ToolStatus::Demoted) => {
                Err(ToolFailure::new("denied", format!("`{name}` was demoted from the {} tier and cannot be called there", tier.as_str())))
            }
            Some(ToolStatus::Active) => {
                if let Some((step, own)) = self.shadowed_step(tier, name, session) {
                    return Err(shadowed_failure(name, &step, &own));
                }
                let Some(tool) = self.built_at(tier, name, session) else {
                    return Err(ToolFailure::new("unknown_tool", format!("`{name}` cannot be built")));
                };
                invoke(&tool, args, &self.direct_call(session, "")).await
            }
        }
    }
}

/// The registry as the [`crate::tools::ToolLookup`] of compose pipelines (held weakly: tools
/// live inside the registry).
struct RegistryTools(Weak<Registry>);

impl crate::tools::ToolLookup for RegistryTools {
    fn lookup(&self, name: &str, session_id: &str) -> Option<Tool> {
        self.0.upgrade()?.resolve_tool(name, session_id)
    }

    fn contains(&self, name: &str, session_id: &str) -> bool {
        self.0.upgrade().is_some_and(|r| r.reaches(name, session_id))
    }

    fn available(&self, session_id: &str) -> Vec<String> {
        self.0.upgrade().map(|r| r.reachable_names(session_id)).unwrap_or_default()
    }

    fn pipeline_steps(&self, name: &str, session_id: &str) -> Vec<String> {
        let Some(registry) = self.0.upgrade() else { return vec![] };
        // An own tool of that name is what runs: a forged pipeline stored under it has no steps.
        if registry.is_own(name) {
            return vec![];
        }
        let state = registry.state.borrow();
        match state.resolve(name, session_id).map(|(_, entry)| &entry.record.current.request.implementation) {
            Some(crate::forge::Implementation::Compose { steps }) => steps.iter().map(|step| step.tool.clone()).collect(),
            _ => vec![],
        }
    }
}
