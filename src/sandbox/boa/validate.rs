//! Static validation: the early, friendly layer. Source is checked for size and nesting depth
//! *before* parsing (Boa's parser recurses ~10 KiB of Rust stack per nesting level), then parsed
//! with Boa's own parser as a Script and walked with a `boa_ast` visitor that rejects blocked
//! names with a readable reason. Runtime hardening (`realm.rs`) is what actually holds; this
//! layer only turns the obvious cases into a `rejected` result instead of a runtime error.

use std::ops::ControlFlow;

use boa_engine::ast::{
    expression::{
        access::PropertyAccessField,
        literal::{Literal, LiteralKind},
        Call, Identifier, ImportCall,
    },
    property::PropertyName,
    scope::Scope,
    visitor::{VisitWith, Visitor},
    Expression,
};
use boa_engine::interner::Interner;
use boa_engine::parser::{Parser, Source};

/// Why code was rejected before running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Stable machine-readable code (`blocked_identifier`, `syntax`, `too_deep`, …).
    pub code: &'static str,
    pub message: String,
}

impl Rejection {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}

/// Static limits applied before and during parsing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SourceLimits {
    pub max_source_bytes: usize,
    /// Maximum bracket nesting (`(`, `[`, `{`, template `${`).
    pub max_nesting: usize,
    /// Maximum number of nesting-capable operators that do not use brackets
    /// (`?:` chains, `=>` chains, runs of prefix unary operators).
    pub max_operator_chain: usize,
}

/// Identifiers that never resolve to anything useful here, with the reason we give.
fn blocked_identifier(name: &str) -> Option<&'static str> {
    Some(match name {
        "eval" => "eval is not available: string compilation is disabled",
        "Function" | "AsyncFunction" | "GeneratorFunction" => "the Function constructor is not available: string compilation is disabled",
        "require" | "module" | "exports" | "__dirname" | "__filename" => {
            "CommonJS (require/module/exports) is not available: the code runs without a module system"
        }
        "process" | "child_process" | "Deno" | "Bun" => "process APIs are not available in the sandbox",
        "globalThis" | "global" | "window" | "self" | "frames" | "parent" | "top" => {
            "the global object is not accessible: define function execute(input) and use its input"
        }
        "SharedArrayBuffer" | "Atomics" | "WeakRef" | "FinalizationRegistry" | "WebAssembly" => "this global is not available in the sandbox",
        "XMLHttpRequest" | "WebSocket" | "importScripts" | "postMessage" | "Worker" | "document" | "navigator" | "location" | "localStorage" | "indexedDB"
        | "setTimeout" | "setInterval" | "setImmediate" | "queueMicrotask" => {
            "this host API is not available in the sandbox (only fetch and crypto, when allowlisted)"
        }
        _ => return None,
    })
}

/// Opt-in host APIs: referencing them requires the request's allowlist to name them.
const OPT_IN: &[&str] = &["fetch", "crypto"];

/// Validates `code` for a request whose allowlist is `allowlist`.
pub(crate) fn validate(code: &str, allowlist: &[String], limits: &SourceLimits) -> Result<(), Rejection> {
    if code.len() > limits.max_source_bytes {
        return Err(Rejection::new("too_large", format!("source is {} bytes; the limit is {}", code.len(), limits.max_source_bytes)));
    }
    for name in allowlist {
        if !OPT_IN.contains(&name.as_str()) {
            return Err(Rejection::new("unknown_api", format!("allowlist entry '{name}' is not a host API (known: fetch, crypto)")));
        }
    }
    check_nesting(code, limits)?;

    let mut interner = Interner::default();
    let scope = Scope::new_global();
    let script = match Parser::new(Source::from_bytes(code)).parse_script(&scope, &mut interner) {
        Ok(script) => script,
        Err(err) => {
            // A module parses where a script does not: say so plainly.
            let mut module_interner = Interner::default();
            if Parser::new(Source::from_bytes(code)).parse_module(&Scope::new_global(), &mut module_interner).is_ok() {
                return Err(Rejection::new("module_syntax", "module syntax (import/export) is not allowed: define function execute(input) in a plain script"));
            }
            return Err(Rejection::new("syntax", format!("syntax error: {err}")));
        }
    };
    let mut visitor = Checker { interner: &interner, allowlist, found: None };
    let _ = script.visit_with(&mut visitor);
    match visitor.found {
        Some(rejection) => Err(rejection),
        None => Ok(()),
    }
}

/// Conservative pre-parse scan bounding the parser's recursion depth. Strings, template text
/// and comments are skipped; regex literals are not recognised, which can only over-count.
/// Scans template-literal text from `i` to the closing backtick (returning its index) or to the
/// next `${`, which opens a nesting level (returning the index of its `{`).
fn scan_template_text(bytes: &[u8], mut i: usize, depth: &mut usize, max_depth: &mut usize, template_stack: &mut Vec<usize>) -> usize {
    loop {
        if i >= bytes.len() || bytes[i] == b'`' {
            return i;
        }
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if bytes[i] == b'$' && bytes.get(i + 1) == Some(&b'{') {
            template_stack.push(*depth);
            *depth += 1;
            *max_depth = (*max_depth).max(*depth);
            return i + 1;
        }
        i += 1;
    }
}

fn check_nesting(code: &str, limits: &SourceLimits) -> Result<(), Rejection> {
    let bytes = code.as_bytes();
    let mut depth = 0usize;
    let mut max_depth = 0usize;
    let mut chain = 0usize; // `?` ternaries and `=>` arrows in the whole source
    let mut unary_run = 0usize;
    let mut max_unary_run = 0usize;
    // Template literal nesting: each entry is the bracket depth at which `${` opened.
    let mut template_stack: Vec<usize> = Vec::new();
    let mut i = 0;
    let too_deep = |what: &str, n: usize, max: usize| Rejection::new("too_deep", format!("{what} is {n}; the limit is {max}"));
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
                continue;
            }
            b'\'' | b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != c && bytes[i] != b'\n' {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'`' => {
                i = scan_template_text(bytes, i + 1, &mut depth, &mut max_depth, &mut template_stack);
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                max_depth = max_depth.max(depth);
            }
            b')' | b']' => depth = depth.saturating_sub(1),
            b'}' => {
                depth = depth.saturating_sub(1);
                if template_stack.last() == Some(&depth) {
                    // Back in template text: resume scanning it.
                    template_stack.pop();
                    i = scan_template_text(bytes, i + 1, &mut depth, &mut max_depth, &mut template_stack);
                }
            }
            b'?' if !matches!(bytes.get(i + 1), Some(b'?' | b'.')) => chain += 1,
            b'=' if bytes.get(i + 1) == Some(&b'>') => chain += 1,
            _ => {}
        }
        if matches!(c, b'!' | b'~' | b'-' | b'+') {
            unary_run += 1;
            max_unary_run = max_unary_run.max(unary_run);
        } else if !c.is_ascii_whitespace() {
            unary_run = 0;
        }
        if max_depth > limits.max_nesting {
            return Err(too_deep("bracket nesting depth", max_depth, limits.max_nesting));
        }
        i += 1;
    }
    if chain > limits.max_operator_chain {
        return Err(too_deep("the number of '?:' and '=>' operators", chain, limits.max_operator_chain));
    }
    if max_unary_run > limits.max_nesting {
        return Err(too_deep("a run of unary operators", max_unary_run, limits.max_nesting));
    }
    Ok(())
}

struct Checker<'a> {
    interner: &'a Interner,
    allowlist: &'a [String],
    found: Option<Rejection>,
}

impl Checker<'_> {
    fn name(&self, ident: &Identifier) -> String {
        self.interner.resolve_expect(ident.sym()).to_string()
    }

    fn reject(&mut self, rejection: Rejection) -> ControlFlow<()> {
        self.found = Some(rejection);
        ControlFlow::Break(())
    }
}

impl<'ast> Visitor<'ast> for Checker<'_> {
    type BreakTy = ();

    fn visit_identifier(&mut self, node: &'ast Identifier) -> ControlFlow<()> {
        let name = self.name(node);
        if let Some(reason) = blocked_identifier(&name) {
            return self.reject(Rejection::new("blocked_identifier", format!("'{name}': {reason}")));
        }
        if OPT_IN.contains(&name.as_str()) && !self.allowlist.iter().any(|a| a == &name) {
            return self.reject(Rejection::new("not_allowlisted", crate::sandbox::not_allowlisted_message(&name)));
        }
        ControlFlow::Continue(())
    }

    // `x.process` and `{ process: 1 }` name properties, not bindings: only computed parts are walked.
    fn visit_property_access_field(&mut self, node: &'ast PropertyAccessField) -> ControlFlow<()> {
        match node {
            PropertyAccessField::Const(_) => ControlFlow::Continue(()),
            PropertyAccessField::Expr(expr) => self.visit_expression(expr),
        }
    }

    fn visit_property_name(&mut self, node: &'ast PropertyName) -> ControlFlow<()> {
        match node {
            PropertyName::Literal(_) => ControlFlow::Continue(()),
            PropertyName::Computed(expr) => self.visit_expression(expr),
        }
    }

    fn visit_import_call(&mut self, _node: &'ast ImportCall) -> ControlFlow<()> {
        self.reject(Rejection::new("dynamic_import", "import() is not allowed: there is no module loader"))
    }

    fn visit_expression(&mut self, node: &'ast Expression) -> ControlFlow<()> {
        if let Expression::ImportMeta(_) = node {
            return self.reject(Rejection::new("module_syntax", "import.meta is not allowed"));
        }
        node.visit_with(self)
    }

    fn visit_call(&mut self, node: &'ast Call) -> ControlFlow<()> {
        // `(() => {}).constructor('…')` and `x['constructor']('…')`: the classic path to the
        // Function constructor. (Denied at runtime as well.)
        if let Expression::PropertyAccess(boa_engine::ast::expression::access::PropertyAccess::Simple(simple)) = node.function() {
            let is_constructor = match simple.field() {
                PropertyAccessField::Const(ident) => self.name(ident) == "constructor",
                PropertyAccessField::Expr(expr) => matches!(
                    &**expr,
                    Expression::Literal(lit) if matches!(lit.kind(), LiteralKind::String(sym)
                        if self.interner.resolve_expect(*sym).to_string() == "constructor")
                ),
            };
            if is_constructor {
                return self.reject(Rejection::new("blocked_identifier", "calling '.constructor(…)' is not allowed: string compilation is disabled"));
            }
        }
        node.visit_with(self)
    }

    fn visit_literal(&mut self, node: &'ast Literal) -> ControlFlow<()> {
        if let LiteralKind::String(sym) = *node.kind() {
            let text = self.interner.resolve_expect(sym).to_string();
            if matches!(text.as_str(), "child_process" | "node:child_process") {
                return self
                    .reject(Rejection::new("blocked_identifier", format!("the string '{text}' names a process API, which is not available in the sandbox")));
            }
        }
        ControlFlow::Continue(())
    }
}
