//! Forging: a request checked, tested and judged ([`Registry::verify`]), then registered in the
//! session tier, answered with the tool it already is, or recorded as rejected
//! ([`Registry::settle`]).

use std::rc::Rc;

use serde_json::Value;

use crate::agent::{unless_cancelled, CancelSignal, EventBody, UsageRecorder};
use crate::forge::{Admission, Checked, Evidence, ForgeOrigin, ForgeRequest, ForgeResult, JudgeUsage, Kept, Rejection, Verified, FORGE_TOOL_NAME};
use crate::guard::SessionTicket;
use crate::tools::CallContext;

use super::{
    content_hash, tool_info, verdict_detail, AuditSubject, Entry, Registry, State, Tier, ToolRecord, ToolStats, ToolStatus, ToolVersion, MAX_VERSIONS,
};

impl Registry {
    /// Forges a tool for `session` outside any run. Never fails: a bad request is a rejected
    /// [`ForgeResult`] with a reason and category.
    pub async fn forge(&self, request: &Value, session: &str) -> ForgeResult {
        self.forge_scoped(request, session, None).await
    }

    /// [`Registry::forge`] with a scope label (a task id, say) tagging the attempt, its events
    /// and its audit entries; a `scope` in the request wins.
    pub async fn forge_scoped(&self, request: &Value, session: &str, scope: Option<String>) -> ForgeResult {
        self.forge_from(request, self.origin(session, scope, "", "")).await
    }

    /// Forges for the `forge_tool` call `ctx`, tagged with its run's scope label: within its
    /// run (events carry the run's id), or, for a call made through the registry API, in none
    /// (its id still reaches the forge's own calls, for their abort signal). The run's abort
    /// stops it as [`Registry::forge_cancellable`] does (`None`: nothing was recorded).
    /// The judge's tokens go to the call's usage recorder ([`CallContext::usage`]), so its run
    /// counts them; also when an abort then discards the forge, since they were spent.
    pub async fn forge_for_call(&self, request: &Value, ctx: &CallContext) -> Option<ForgeResult> {
        let run_id = if ctx.direct { "" } else { ctx.run_id.as_str() };
        let cancel = ctx.cancel.as_ref().map(|signal| &*signal.0);
        self.forge_until(request, self.origin(&ctx.session_id, ctx.scope.clone(), run_id, &ctx.run_id), cancel, ctx.usage.as_ref()).await
    }

    /// Rejects, and counts, a forge request the host could not even turn into JSON (a
    /// circular object, a `BigInt`): a bad request is a `parse_error` result, never an error.
    pub async fn reject_unreadable(&self, problem: &str, session: &str, scope: Option<String>) -> ForgeResult {
        let reason = format!("could not read the forge request: {problem}");
        self.reject_unread(reason, Evidence { parse: true, ..Default::default() }, session, scope).await
    }

    /// Rejects, and counts, a forge request whose JSON text (`units` long) was too long to be
    /// read at all: a `shape_check` result, as it would be once read (see
    /// [`crate::forge::MAX_REQUEST_TEXT_BYTES`]).
    pub async fn reject_oversized(&self, units: usize, session: &str, scope: Option<String>) -> ForgeResult {
        let reason = crate::forge::oversized_request_text(units).unwrap_or_else(|| format!("the request is {units} characters of JSON text"));
        self.reject_unread(reason, Evidence { shape: true, ..Default::default() }, session, scope).await
    }

    async fn reject_unread(&self, reason: String, evidence: Evidence, session: &str, scope: Option<String>) -> ForgeResult {
        let origin = self.origin(session, scope, "", "");
        let mut rejection = Rejection::new("", reason, evidence);
        rejection.scope = origin.scope.clone();
        self.reject(&rejection, &origin, "forge").await
    }

    fn origin(&self, session: &str, scope: Option<String>, run_id: &str, calls_run_id: &str) -> ForgeOrigin {
        ForgeOrigin {
            agent_id: self.agent_id.clone(),
            session_id: session.to_string(),
            scope: scope.as_deref().map(crate::forge::scope_label),
            run_id: run_id.to_string(),
            calls_run_id: calls_run_id.to_string(),
            imported_from: None,
        }
    }

    /// [`Registry::forge_scoped`] that `cancel` stops while the request is checked, tested and
    /// judged (`None`: nothing was recorded). Once the verdict is in, the forge runs to its end,
    /// so a forge that reports `aborted` never leaves a tool registered. The forge's judge and
    /// the host tools its tests call get `calls_run_id` as their run id, so the host can hand
    /// them the abort signal too (its events carry no run id: the forge is in none).
    pub async fn forge_cancellable(
        &self,
        request: &Value,
        session: &str,
        scope: Option<String>,
        cancel: Option<&dyn CancelSignal>,
        calls_run_id: &str,
    ) -> Option<ForgeResult> {
        self.forge_until(request, self.origin(session, scope, "", calls_run_id), cancel, None).await
    }

    /// `spent` receives what the judge spent as soon as it answered.
    async fn forge_until(&self, request: &Value, origin: ForgeOrigin, cancel: Option<&dyn CancelSignal>, spent: Option<&UsageRecorder>) -> Option<ForgeResult> {
        let ticket = self.ticket(&origin.session_id);
        let checked = unless_cancelled(cancel, self.verify(request, &origin, &self.lookup())).await?;
        if let (Some(spent), Some(judge)) = (spent, judge_usage(&checked)) {
            spent.record(&judge.model_id, judge.usage);
        }
        // The judge and the host tools see the same signal: their failure may end the work in
        // the very poll that cancels it, and is then the abort's doing, not the tool's. Closing
        // the agent stops its sandbox: tests ended that way are no verdict on the code either.
        if cancel.is_some_and(|c| c.is_cancelled()) || self.is_closed() {
            return None;
        }
        Some(self.settle(checked, &origin, &ticket, "forge").await)
    }

    async fn forge_from(&self, request: &Value, origin: ForgeOrigin) -> ForgeResult {
        let ticket = self.ticket(&origin.session_id);
        let checked = self.verify(request, &origin, &self.lookup()).await;
        self.settle(checked, &origin, &ticket, "forge").await
    }

    /// Registers a verified tool (`action` names it in the audit trail), answers an unchanged
    /// request with the tool it already is, or records the rejection.
    pub(crate) async fn settle(&self, checked: Result<Checked, Rejection>, origin: &ForgeOrigin, ticket: &SessionTicket, action: &str) -> ForgeResult {
        match checked {
            Ok(Checked::Verified(verified)) => self.register_session(*verified, origin, action, ticket).await,
            Ok(Checked::Unchanged(kept)) => self.keep_unchanged(*kept, origin, action).await,
            Err(rejection) => self.reject(&rejection, origin, action).await,
        }
    }

    /// Answers a forge or import identical to the tool the session is offered under its name
    /// with that tool as it is: audited as `unchanged` (`import.unchanged`), announced with
    /// `forge.registered` for its current version, and not counted in the forge stats (nothing
    /// was forged or judged). A model that forges the same request again (small ones do, after
    /// success too), or a package imported twice, would otherwise pay a judge call for a new
    /// version whose fresh stats set its promotion back to zero uses. An import has nothing to
    /// re-check either: its content, tests included, is what this agent's own checks passed.
    async fn keep_unchanged(&self, kept: Kept, origin: &ForgeOrigin, action: &str) -> ForgeResult {
        let Kept { tool, verdict, scope } = kept;
        let ops = {
            let mut detail = format!("hash {}: identical to the registered version, not tested or judged again", tool.hash);
            if let Some(from) = &origin.imported_from {
                detail.push_str(&format!("; the package says it came from {from}"));
            }
            let who = AuditSubject::attempt(&origin.session_id, scope.as_deref());
            let entry = if action == "import" { "import.unchanged" } else { "unchanged" };
            self.audit(&mut self.state.borrow_mut(), entry, &tool.name, Some(tool.version), Some(tool.tier), detail, who)
        };
        self.emit(
            &origin.run_id,
            EventBody::ForgeRegistered {
                name: tool.name.clone(),
                tier: tool.tier,
                version: tool.version,
                hash: tool.hash.clone(),
                unchanged: true,
                agent_id: origin.agent_id.clone(),
                session_id: origin.session_id.clone(),
                scope: scope.clone(),
            },
        );
        let _ = self.persist(ops).await;
        ForgeResult { success: true, tool: Some(tool), verdict: Some(verdict), tests: Some(vec![]), reason: None, category: None, unchanged: true, usage: None }
    }

    /// Counts a forge or import of `session` as going until the ticket is dropped: its tool
    /// must not bring the session back if it ends meanwhile.
    pub(crate) fn ticket(&self, session: &str) -> SessionTicket {
        self.forges.begin(session)
    }

    /// Why `session` has no room for a new tool `name` (one replacing its own version always
    /// fits). Asked before the tests, and again at registration: forges that ran at the same
    /// time were all admitted against the same count.
    fn session_room(&self, state: &State, session: &str, name: &str) -> Result<(), String> {
        let max = self.config.max_session_tools;
        state
            .room(Tier::Session, session, name, max)
            .map_err(|count| format!("this session already has {count} forged tools (maxSessionTools is {max}); reuse or improve an existing tool"))
    }

    pub(crate) async fn verify(&self, request: &Value, origin: &ForgeOrigin, tools: &Rc<dyn crate::tools::ToolLookup>) -> Result<Checked, Rejection> {
        let session = origin.session_id.clone();
        let admit = |req: &ForgeRequest| {
            if req.name == FORGE_TOOL_NAME {
                return Err(format!("`{FORGE_TOOL_NAME}` is reserved"));
            }
            // Taking an own tool's name would put forged code behind every pipeline and every
            // turn that calls it, with tests that only show it behaving on their own inputs.
            self.refuse_own_name(&req.name)?;
            if let Some(kept) = self.unchanged(req, &session) {
                return Ok(Admission::Unchanged(kept));
            }
            let state = self.state.borrow();
            self.refuse_close_name(&state, &session, &req.name)?;
            self.refuse_shadowed_steps(&state, &session, req)?;
            self.session_room(&state, &session, &req.name).map(|()| Admission::New { next_version: state.next_version(&req.name) })
        };
        let run_id = origin.run_id.clone();
        let emit = |body: EventBody| self.emit(&run_id, body);
        self.forge.verify(request, origin, tools, &admit, &emit).await
    }

    /// The tool a request is already, if any: the one a run of `session` is offered under its
    /// name (built, its steps reachable), judged, with the request's content hash. One the
    /// session could not call is no answer: the forge is checked in full and says why.
    fn unchanged(&self, req: &ForgeRequest, session: &str) -> Option<Box<Kept>> {
        let (tier, _) = self.offered(&req.name, session)?;
        let state = self.state.borrow();
        let entry = state.entry(tier, session, &req.name)?;
        let verdict = entry.record.current.verdict.clone()?;
        // Hashed only when the name is taken: a new name (most forges) costs nothing here.
        (entry.record.current.hash == content_hash(req)).then(|| Box::new(Kept { tool: tool_info(entry), verdict, scope: None }))
    }

    /// Records a rejected forge, or a rejected import (`action` "import": audited as
    /// `import.rejected`, so the trail tells a package that failed its tests or its judge from a
    /// forge that did).
    pub(crate) async fn reject(&self, rejection: &Rejection, origin: &ForgeOrigin, action: &str) -> ForgeResult {
        let ops = {
            let mut state = self.state.borrow_mut();
            // A forge the sandbox could not test says nothing of the code: not a rejection to count.
            let mut ops = vec![];
            if !rejection.sandbox_unavailable {
                let name_changed = state.forge_stats.record_rejected(&rejection.name, rejection.category);
                ops = self.forge_stats_ops(&state, name_changed.then_some((rejection.name.as_str(), false)));
            }
            if let Some(v) = &rejection.verdict {
                ops.extend(self.audit(
                    &mut state,
                    "verdict",
                    &rejection.name,
                    None,
                    None,
                    verdict_detail(v),
                    AuditSubject::attempt(&origin.session_id, rejection.scope.as_deref()),
                ));
            }
            ops.extend(self.audit(
                &mut state,
                if action == "import" { "import.rejected" } else { "reject" },
                &rejection.name,
                None,
                None,
                format!("{}: {}", rejection.category.as_str(), rejection.reason),
                AuditSubject::attempt(&origin.session_id, rejection.scope.as_deref()),
            ));
            ops
        };
        self.emit(
            &origin.run_id,
            EventBody::ForgeRejected {
                name: rejection.name.clone(),
                category: rejection.category,
                reason: rejection.reason.clone(),
                agent_id: origin.agent_id.clone(),
                session_id: origin.session_id.clone(),
                scope: rejection.scope.clone(),
            },
        );
        let _ = self.persist(ops).await; // the audit write is best effort; the rejection stands
        ForgeResult::rejected(rejection)
    }

    /// Registers a verified tool in the session tier (a new version when the name exists).
    pub(crate) async fn register_session(&self, verified: Verified, origin: &ForgeOrigin, action: &str, ticket: &SessionTicket) -> ForgeResult {
        let session = origin.session_id.as_str();
        let ended = ticket.session_ended();
        // Forges and imports run at once (the calls of one step, say) are all checked before
        // any is registered: one identical to a tool registered meanwhile gets that tool, as it
        // would had it come after, and not a second version of the same content whose fresh
        // stats set the tool's promotion back to zero uses.
        if !ended {
            if let Some(mut kept) = self.unchanged(&verified.request, session) {
                kept.scope = verified.request.scope.clone();
                // Unchanged by the time it was judged: that judge call was still made.
                let usage = verified.judge_usage.map(|j| j.usage);
                return ForgeResult { usage, ..self.keep_unchanged(*kept, origin, action).await };
            }
        }
        let refusal = {
            let state = self.state.borrow();
            if ended {
                Err(format!("session `{session}` ended while the tool was being forged; it was not registered"))
            } else {
                // Own tools may have changed while it was tested (a host adding tools).
                self.refuse_own_name(&verified.request.name)
                    .and_then(|()| self.refuse_close_name(&state, session, &verified.request.name))
                    .and_then(|()| self.refuse_shadowed_steps(&state, session, &verified.request))
                    .and_then(|()| self.session_room(&state, session, &verified.request.name))
                    .and_then(|()| registered_since(&state, session, &verified.request.name, verified.next_version))
            }
        };
        if let Err(reason) = refusal {
            let mut rejection = Rejection::new(&verified.request.name, reason, Evidence::default());
            rejection.scope = verified.request.scope.clone();
            rejection.tests = verified.tests;
            rejection.verdict = Some(verified.verdict);
            rejection.judge_usage = verified.judge_usage;
            return self.reject(&rejection, origin, action).await;
        }
        let hash = content_hash(&verified.request);
        let now = self.now();
        let name = verified.request.name.clone();
        let scope = verified.request.scope.clone();
        let who = || AuditSubject::attempt(session, scope.as_deref());
        let (info, ops) = {
            let mut state = self.state.borrow_mut();
            let version = state.next_version(&name);
            // This session's entry (active or demoted) is replaced; its history carries over,
            // else that of the tool the session reaches above it (a new version of a promoted
            // tool keeps the versions before it).
            let own = state.remove_entry(Tier::Session, session, &name).map(|e| {
                let mut promotion = e.record.promotion;
                promotion.version_left(&e.record.current.hash, e.stats.successes);
                (e.record.history, promotion)
            });
            // The memo is kept: it names the versions it holds off (by hash), and a rollback to
            // one of them must not make a rejected or demoted version eligible again.
            // A new version of a tool above the session takes its memo too when this agent's
            // panel and operators kept it (another agent's shared tool carries its owner's).
            let (mut history, promotion) = own.unwrap_or_else(|| {
                let above = state.resolve(&name, session).map(|(_, e)| &e.record);
                let history = above.map(|r| r.history.clone()).unwrap_or_default();
                let promotion = above.filter(|r| r.origin.agent_id == self.agent_id).map(|r| r.promotion.clone()).unwrap_or_default();
                (history, promotion)
            });
            let current = ToolVersion {
                version,
                hash: hash.clone(),
                request: verified.request,
                verdict: Some(verified.verdict.clone()),
                created_at: now,
                reviewed_for: None,
            };
            history.push(current.clone());
            if history.len() > MAX_VERSIONS {
                history.remove(0);
            }
            let record = ToolRecord {
                name: name.clone(),
                tier: Tier::Session,
                status: ToolStatus::Active,
                current,
                history,
                session_id: Some(session.to_string()),
                origin: ForgeOrigin { scope: scope.clone(), ..origin.clone() },
                promotion,
            };
            let entry = Entry::new(record, ToolStats::default());
            let info = tool_info(&entry);
            state.tier_mut(Tier::Session, session).insert(name.clone(), entry);
            let name_changed = state.forge_stats.record_approved(&name, verified.verdict.confidence);
            let v = &verified.verdict;
            let mut ops = self.forge_stats_ops(&state, name_changed.then_some((info.name.as_str(), true)));
            let detail = match &origin.imported_from {
                Some(from) => format!("hash {hash}; the package says it came from {from}"),
                None => format!("hash {hash}"),
            };
            ops.extend(self.audit(&mut state, action, &info.name, Some(version), Some(Tier::Session), detail, who()));
            ops.extend(self.audit(&mut state, "verdict", &info.name, Some(version), None, verdict_detail(v), who()));
            ops.extend(self.audit(&mut state, "register", &info.name, Some(version), Some(Tier::Session), format!("registered in session `{session}`"), who()));
            (info, ops)
        };
        self.emit(
            &origin.run_id,
            EventBody::ForgeRegistered {
                name: info.name.clone(),
                tier: Tier::Session,
                version: info.version,
                hash: info.hash.clone(),
                unchanged: false,
                agent_id: origin.agent_id.clone(),
                session_id: session.to_string(),
                scope: scope.clone(),
            },
        );
        let _ = self.persist(ops).await;
        ForgeResult {
            success: true,
            tool: Some(info),
            verdict: Some(verified.verdict),
            tests: Some(verified.tests),
            reason: None,
            category: None,
            unchanged: false,
            usage: verified.judge_usage.map(|j| j.usage),
        }
    }
}

/// What a checked forge's judge spent, if it was asked (an unchanged request never is).
fn judge_usage(checked: &Result<Checked, Rejection>) -> Option<&JudgeUsage> {
    match checked {
        Ok(Checked::Verified(verified)) => verified.judge_usage.as_ref(),
        Ok(Checked::Unchanged(_)) => None,
        Err(rejection) => rejection.judge_usage.as_ref(),
    }
}

/// Refuses a different tool `name` for `session` when a version of it numbered `next_version`
/// or later (one registered while this forge or import was checked: the calls of one step run
/// at once) is the session's current one. The first registered stands: replacing it, the later
/// one would leave whoever was told of the first holding a tool that is gone, and its caller
/// checked its request against a session that no longer is. Asked again later, with the
/// session's tool in view, a different request is a new version as usual.
fn registered_since(state: &State, session: &str, name: &str, next_version: u32) -> Result<(), String> {
    match state.entry(Tier::Session, session, name).map(|e| e.record.current.version) {
        Some(version) if version >= next_version => Err(format!(
            "another forge or import registered `{name}` v{version} in this session while this one was checked, so this different `{name}` was not registered; call `{name}` v{version} as it is, or forge this request again in a later step to replace it"
        )),
        _ => Ok(()),
    }
}
