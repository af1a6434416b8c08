//! Static validation: the early, friendly layer. Source is checked for size and nesting depth
//! *before* parsing (Boa's parser recurses ~10 KiB of Rust stack per bracket level, and less
//! for each operator, keyword or label it nests; see `check_nesting`), then parsed
//! with Boa's own parser as a Script and walked with a `boa_ast` visitor that rejects blocked
//! names with a readable reason. Runtime hardening (`realm.rs`) is what actually holds; this
//! layer only turns the obvious cases into a `rejected` result instead of a runtime error.

use std::collections::HashSet;
use std::ops::ControlFlow;

use boa_engine::ast::{
    declaration::{Binding, Declaration},
    expression::{
        access::PropertyAccessField,
        literal::{Literal, LiteralKind},
        Call, Identifier, ImportCall,
    },
    operations::bound_names,
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
    /// Maximum number of `?:`, `=>` and `else` in the whole source.
    pub max_operator_chain: usize,
    /// Maximum of operators, keywords and brackets one expression or statement nests, summed
    /// over the levels around it; `new` counts 2, `if`, `for`, `while` and `with` count 4.
    pub max_expression_nesting: usize,
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

/// Blocked names the sandbox's realm does define: blocked wherever they appear. Every other
/// blocked name is absent from the realm, so the code may declare it for its own use (`parent`
/// of a union-find, `top` of a stack, `function process(item)`): a name it only uses without
/// declaring is still refused with the reason, and would fail at runtime anyway.
fn defined_in_realm(name: &str) -> bool {
    matches!(name, "globalThis" | "Function")
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
    let declared = declared_names(&script, &interner);
    let mut visitor = Checker { interner: &interner, allowlist, declared, found: None };
    let _ = script.visit_with(&mut visitor);
    match visitor.found {
        Some(rejection) => Err(rejection),
        None => Ok(()),
    }
}

/// What an open bracket (or template `${`) opened, as far as the scan needs to know.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opened {
    /// `(` of an `if`/`for`/`while`/`with` head: a `/` after its `)` starts a regex.
    Head,
    /// Any other `(`, an index `[`, a `${`: commas and colons there can nest (comma
    /// expressions, ternaries).
    Expression,
    /// An array or object literal: its commas and colons separate flat elements.
    Literal,
    /// A block, a function or class body: a statement list.
    Block,
    Template,
}

/// One open level: what opened it and the operator count of the level around it.
#[derive(Clone, PartialEq, Eq)]
struct Level {
    opened: Opened,
    outer_run: usize,
}

/// Words before which an expression starts (a `/` after one starts a regex), counted as
/// nesting: the parser recurses on each (`void void …`, `new new …`, `if(a) if(a) …`).
const EXPRESSION_KEYWORDS: &[&[u8]] = &[
    b"await",
    b"case",
    b"delete",
    b"do",
    b"else",
    b"extends",
    b"for",
    b"if",
    b"in",
    b"instanceof",
    b"new",
    b"of",
    b"return",
    b"throw",
    b"typeof",
    b"void",
    b"while",
    b"with",
    b"yield",
];

fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'#' | b'\\') || c >= 0x80
}

/// Whether a line ends at `i` as JS sees it (LF, CR, U+2028, U+2029): line comments and regex
/// literals end there for the parser, so the scan stops skipping there too.
fn line_ends_at(bytes: &[u8], i: usize) -> bool {
    matches!(bytes[i], b'\n' | b'\r') || (bytes[i] == 0xE2 && bytes.get(i + 1) == Some(&0x80) && matches!(bytes.get(i + 2), Some(0xA8 | 0xA9)))
}

/// The length of the white space or line end at `i`, 0 if none. JS's include Unicode ones
/// (U+00A0, U+FEFF, U+2028…): read as part of a word, they would hide the keywords around them.
fn space_at(code: &str, i: usize) -> usize {
    let c = code.as_bytes()[i];
    if c < 0x80 {
        return usize::from(matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0B | 0x0C));
    }
    code.get(i..).and_then(|rest| rest.chars().next()).filter(|&ch| ch.is_whitespace() || ch == '\u{feff}').map_or(0, char::len_utf8)
}

/// Scans template-literal text from `i` to the closing backtick or to the next `${`, and
/// returns the index of that backtick or of the `{`.
fn scan_template_text(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && bytes[i] != b'`' {
        if bytes[i] == b'\\' {
            i += 1;
        } else if bytes[i] == b'$' && bytes.get(i + 1) == Some(&b'{') {
            return i + 1;
        }
        i += 1;
    }
    i
}

/// Skips a regex literal's body and flags from its opening `/` at `i`: returns the index of
/// its last byte, and whether it was closed. A `/` inside a class (`[/]`) or escaped does not
/// end it; a line end does (without closing it: a syntax error).
fn skip_regex(bytes: &[u8], mut i: usize) -> (usize, bool) {
    let mut in_class = false;
    i += 1;
    while i < bytes.len() && !line_ends_at(bytes, i) {
        match bytes[i] {
            b'\\' => i += 1,
            b'[' => in_class = true,
            b']' => in_class = false,
            b'/' if !in_class => {
                while bytes.get(i + 1).is_some_and(|&c| is_word_byte(c)) {
                    i += 1;
                }
                return (i, true);
            }
            _ => {}
        }
        i += 1;
    }
    (i - 1, false)
}

/// Conservative pre-parse scan bounding the parser's recursion depth, one pass over the bytes
/// with a tokenizer's view of them: strings, template text, comments and regex literals are
/// skipped (a `/` starts a regex where an operand is expected, as the previous significant
/// token tells). It bounds
/// - bracket nesting (`(`, `[`, `{`, template `${`), the parser's costliest recursion;
/// - the operators, keywords and brackets of one expression or statement, summed over the
///   enclosing levels: the parser or the walks of its tree recurse once for each
///   (`a+a+…`, `b=b=…`, `a**a**…`, `void void …`, `l:l:…`, `if(a) if(a) …`, `f()()…`);
///   a `;`, a comma between literal elements, or two operands in a row (a statement that
///   ended without a `;`) start the count again;
/// - `?:`, `=>` and `else` in the whole source (their chains nest through brackets);
/// - runs of prefix unary operators.
///
/// Where the previous token cannot tell a regex from a division without a parser (after a
/// `}`, which may close a block or a function or class expression, or an object after a
/// keyword; after `of`, `yield` and `await`, which may be variable names), the rest of the
/// source is scanned both ways and refused if either reading exceeds a limit: reading a
/// division as a regex would skip the code up to the next `/`.
fn check_nesting(code: &str, limits: &SourceLimits) -> Result<(), Rejection> {
    let mut readings = Readings { pending: vec![Scan::default()], seen: Vec::new(), bytes_left: 4 * code.len() + (1 << 20) };
    while let Some(scan) = readings.pending.pop() {
        scan.run(code, limits, &mut readings)?;
    }
    Ok(())
}

/// The readings of a source that `check_nesting` has still to scan, and what bounds them.
struct Readings<'a> {
    pending: Vec<Scan<'a>>,
    /// The states the scan was in at an ambiguous `/`: a reading that reaches one again (the
    /// two readings met again, as they mostly do at the next statement) goes on as it did.
    seen: Vec<Scan<'a>>,
    /// How many more bytes the readings may scan: readings that do not meet again double at
    /// each ambiguous `/`.
    bytes_left: usize,
}

impl<'a> Readings<'a> {
    /// Called at an ambiguous `/` at `here.i`, `from` the byte the current reading started or
    /// last forked at: queues the division reading, or says the current one need not go on.
    fn fork(&mut self, here: Scan<'a>, from: usize) -> Result<ControlFlow<()>, Rejection> {
        if self.seen.contains(&here) {
            return Ok(ControlFlow::Break(()));
        }
        if self.seen.len() == MAX_AMBIGUOUS_SLASHES {
            return Err(too_many_readings());
        }
        self.bytes_left -= here.i - from;
        self.pending.push(Scan { after_operand: true, after_block: false, ..here.clone() });
        self.seen.push(here);
        Ok(ControlFlow::Continue(()))
    }
}

/// How many ambiguous `/` (with distinct scan states) one source may hold (few realistic
/// sources hold any: a regex after a `}` or a division after `of` is rare).
const MAX_AMBIGUOUS_SLASHES: usize = 1024;

fn too_many_readings() -> Rejection {
    Rejection::new(
        "too_deep",
        "the '/' after '}', 'of', 'yield' or 'await' that could each be a regex or a division are too many to read both ways; put the operand before such a division in parentheses",
    )
}

/// The state of `check_nesting`'s scan at a byte: what a second reading starts from.
#[derive(Clone, Default, PartialEq, Eq)]
struct Scan<'a> {
    i: usize,
    levels: Vec<Level>,
    /// `?` ternaries, `=>` arrows and `else` in the whole source.
    chain: usize,
    unary_run: usize,
    /// Operators etc. of the current expression or statement, and the sum over enclosing levels.
    run: usize,
    outer: usize,
    /// The previous significant token ended an operand (a `/` after it divides), or closed a block.
    after_operand: bool,
    after_block: bool,
    prev_byte: u8,
    prev_word: &'a [u8],
}

impl<'a> Scan<'a> {
    /// Scans from `self.i` to the end; the other reading of an ambiguous `/` goes to `readings`.
    fn run(self, code: &'a str, limits: &SourceLimits, readings: &mut Readings<'a>) -> Result<(), Rejection> {
        let bytes = code.as_bytes();
        let Scan { mut i, mut levels, mut chain, mut unary_run, mut run, mut outer, mut after_operand, mut after_block, mut prev_byte, mut prev_word } = self;
        let mut from = i;
        let too_deep = |what: &str, n: usize, max: usize| Rejection::new("too_deep", format!("{what} is {n}; the limit is {max}"));
        while i < bytes.len() {
            if i - from > readings.bytes_left {
                return Err(too_many_readings());
            }
            let c = bytes[i];
            let space = space_at(code, i);
            if space > 0 {
                i += space;
                continue;
            }
            if c == b'/' && matches!(bytes.get(i + 1), Some(b'/' | b'*')) {
                if bytes[i + 1] == b'/' {
                    while i < bytes.len() && !line_ends_at(bytes, i) {
                        i += 1;
                    }
                } else {
                    i += 2;
                    while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                        i += 1;
                    }
                    i += 2;
                }
                continue;
            }
            let ambiguous = c == b'/' && !after_operand && (after_block || matches!(prev_word, b"of" | b"yield" | b"await"));
            if ambiguous {
                let here = Scan { i, levels: levels.clone(), chain, unary_run, run, outer, after_operand, after_block, prev_byte, prev_word };
                if readings.fork(here, from)?.is_break() {
                    return Ok(());
                }
                from = i;
            }
            // (Not a template: after an operand, it is a tag's.)
            let starts_operand = is_word_byte(c) || matches!(c, b'\'' | b'"') || (c == b'/' && !after_operand);
            let word_end =
                if is_word_byte(c) { (i..bytes.len()).find(|&j| !is_word_byte(bytes[j]) || space_at(code, j) > 0).unwrap_or(bytes.len()) } else { i };
            let word = &bytes[i..word_end];
            // A word after a `.` names a property, never a keyword.
            let keyword = !word.is_empty() && prev_byte != b'.' && EXPRESSION_KEYWORDS.contains(&word);
            // Two operands in a row: the statement before ended without a `;` (or this is a syntax
            // error, where parsing stops). `in`/`instanceof`/`of` continue an expression instead.
            // A `case` starts a clause of the switch's flat list.
            let continues = matches!(word, b"in" | b"instanceof" | b"of");
            if starts_operand && (after_operand || after_block) && !continues || keyword && word == b"case" {
                run = 0;
            }
            let (was_after_operand, was_after_block) = (after_operand, after_block);
            after_operand = true;
            after_block = false;
            match c {
                b'\'' | b'"' => {
                    i += 1;
                    // (A string may hold U+2028 and U+2029, not LF or CR but after a `\`: CR LF too.)
                    while i < bytes.len() && !matches!(bytes[i], b'\n' | b'\r') && bytes[i] != c {
                        if bytes[i] == b'\\' {
                            i += if bytes.get(i + 1..i + 3) == Some(b"\r\n") { 2 } else { 1 };
                        }
                        i += 1;
                    }
                }
                b'`' => i = scan_template_text(bytes, i + 1),
                b'/' if !was_after_operand => match skip_regex(bytes, i) {
                    // The parser stops at a regex left open; the division reading goes on.
                    (_, false) if ambiguous => return Ok(()),
                    (end, _) => i = end,
                },
                _ if !word.is_empty() => {
                    if keyword {
                        // A nested statement or `new` costs the parser several times what an
                        // operator does (measured in the Worker).
                        run += match word {
                            b"if" | b"for" | b"while" | b"with" => 4,
                            b"new" => 2,
                            _ => 1,
                        };
                        after_operand = false;
                        chain += usize::from(word == b"else");
                    }
                    i = word_end - 1;
                }
                b'(' | b'[' | b'{' => {
                    let opened = match c {
                        b'(' if matches!(prev_word, b"if" | b"for" | b"while" | b"with") => Opened::Head,
                        // (After a `}`, a function expression's maybe: `function(){}[a, b]` indexes.)
                        b'[' if !was_after_operand && !was_after_block => Opened::Literal,
                        // After an operator, `(`, `[` or `,`: an object. After a `)`, `;`, `=>`, a
                        // keyword (`return` may end at a line break), at the start: a block.
                        b'{' if !was_after_operand
                            && !matches!(prev_byte, b')' | b']' | b'{' | b'}' | b';' | b'>' | 0)
                            && prev_word.is_empty()
                            && (prev_byte != b':' || levels.last().is_some_and(|l| l.opened == Opened::Literal)) =>
                        {
                            Opened::Literal
                        }
                        b'{' => Opened::Block,
                        _ => Opened::Expression,
                    };
                    levels.push(Level { opened, outer_run: run + 1 });
                    outer += run + 1;
                    run = 0;
                    after_operand = false;
                }
                b')' | b']' | b'}' => {
                    if let Some(level) = levels.pop() {
                        outer -= level.outer_run;
                        run = level.outer_run;
                        match level.opened {
                            Opened::Head => after_operand = false,
                            Opened::Block => (after_operand, after_block) = (false, true),
                            // Back in template text: scan on to its end or its next `${`.
                            Opened::Template => {
                                i = scan_template_text(bytes, i + 1);
                                if bytes.get(i) == Some(&b'{') {
                                    levels.push(Level { opened: Opened::Template, outer_run: run });
                                    (outer, run) = (outer + run, 0);
                                    after_operand = false;
                                }
                            }
                            Opened::Expression | Opened::Literal => {}
                        }
                    }
                }
                b';' => (run, after_operand) = (0, false),
                b',' if levels.last().is_some_and(|l| l.opened == Opened::Literal) => (run, after_operand) = (0, false),
                b':' if levels.last().is_some_and(|l| l.opened == Opened::Literal) => after_operand = false,
                _ => {
                    // An operator (or a stray byte, which the parser refuses). The later bytes of
                    // `==`, `===`, `!=`, `!==`, `<=`, `>=`, `&&`, `||` and `??` count nothing: such
                    // an operator is left-associative, its chain no deeper than one of `+`.
                    let prev = if i > 0 { bytes[i - 1] } else { 0 };
                    let same_operator = c == b'=' && matches!(prev, b'=' | b'!' | b'<' | b'>') || matches!(c, b'&' | b'|' | b'?') && prev == c;
                    run += usize::from(!same_operator);
                    after_operand = false;
                    if c == b'?' && !same_operator && !matches!(bytes.get(i + 1), Some(b'?' | b'.')) || c == b'=' && bytes.get(i + 1) == Some(&b'>') {
                        chain += 1;
                    }
                }
            }
            // A template literal that opened a `${` (its text scan stopped at the `{`).
            if c == b'`' && bytes.get(i) == Some(&b'{') {
                levels.push(Level { opened: Opened::Template, outer_run: run });
                (outer, run) = (outer + run, 0);
                after_operand = false;
            }
            prev_word = match (keyword, word) {
                // `for await (`: a head all the same, after which a `/` starts a regex.
                (true, b"await") if prev_word == b"for" => prev_word,
                (true, _) => word,
                _ => b"",
            };
            prev_byte = bytes.get(i).copied().unwrap_or(0);
            if matches!(c, b'!' | b'~' | b'-' | b'+') {
                unary_run += 1;
            } else {
                unary_run = 0;
            }
            if levels.len() > limits.max_nesting {
                return Err(too_deep("bracket nesting depth", levels.len(), limits.max_nesting));
            }
            if unary_run > limits.max_nesting {
                return Err(too_deep("a run of unary operators", unary_run, limits.max_nesting));
            }
            if chain > limits.max_operator_chain {
                return Err(too_deep("the number of '?:', '=>' and 'else'", chain, limits.max_operator_chain));
            }
            if outer + run > limits.max_expression_nesting {
                return Err(too_deep("the count of operators, keywords and brackets one expression nests", outer + run, limits.max_expression_nesting));
            }
            i += 1;
        }
        Ok(())
    }
}

/// Every name `script` binds anywhere (variables, parameters, catch parameters, functions,
/// classes), whatever its scope: enough to tell a name of the code's own from a reach for a
/// host global that is not there.
fn declared_names(script: &boa_engine::ast::Script, interner: &Interner) -> HashSet<String> {
    struct Declared<'a> {
        interner: &'a Interner,
        names: HashSet<String>,
    }
    impl Declared<'_> {
        fn add(&mut self, names: Vec<boa_engine::interner::Sym>) {
            self.names.extend(names.into_iter().map(|sym| self.interner.resolve_expect(sym).to_string()));
        }
    }
    impl<'ast> Visitor<'ast> for Declared<'_> {
        type BreakTy = std::convert::Infallible;

        fn visit_binding(&mut self, node: &'ast Binding) -> ControlFlow<Self::BreakTy> {
            self.add(bound_names(node));
            node.visit_with(self)
        }

        fn visit_declaration(&mut self, node: &'ast Declaration) -> ControlFlow<Self::BreakTy> {
            self.add(bound_names(node));
            node.visit_with(self)
        }
    }
    let mut declared = Declared { interner, names: HashSet::new() };
    let _ = script.visit_with(&mut declared);
    declared.names
}

struct Checker<'a> {
    interner: &'a Interner,
    allowlist: &'a [String],
    /// Names the code binds itself (see [`declared_names`]).
    declared: HashSet<String>,
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
        if let Some(reason) = blocked_identifier(&name).filter(|_| defined_in_realm(&name) || !self.declared.contains(&name)) {
            return self.reject(Rejection::new("blocked_identifier", format!("'{name}': {reason}")));
        }
        // A local of that name is the code's own; the realm's `fetch` and `crypto` refuse a call
        // outside the allowlist all the same, so a use the declaration does not cover fails there.
        if OPT_IN.contains(&name.as_str()) && !self.allowlist.iter().any(|a| a == &name) && !self.declared.contains(&name) {
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
