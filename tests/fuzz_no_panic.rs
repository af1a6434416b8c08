//! Seeded random input through every parser a model, an endpoint or a package author reaches,
//! and through the whole forge pipeline: none may panic. In wasm a panic is a trap that leaves
//! the core unusable for every agent of the page or process, so "bad input gets a typed error"
//! has to hold for inputs nobody thought of, not only for the ones the other tests name.
//!
//! The generator is a fixed-seed xorshift, so a failure reproduces; `FUZZ_ITERATIONS` runs more.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};

use crucible::agent::{extract_json, json_values};
use crucible::forge::{infer_schemas, normalize, parse_verdict, shape_check};
use crucible::model::{ModelChunk, ResponseAssembler};
use crucible::tools::CompiledSchema;
use futures::executor::block_on;
use serde_json::{json, Map, Value};
use support::emergent::*;

fn iterations(default: usize) -> usize {
    std::env::var("FUZZ_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Keys the runtime gives meaning to: random objects use them, so generated values reach deep
/// into normalization, schemas and pipelines instead of failing at the first lookup.
const KEYS: &[&str] = &[
    "name",
    "description",
    "inputSchema",
    "outputSchema",
    "implementation",
    "mode",
    "steps",
    "tool",
    "inputMapping",
    "testCases",
    "input",
    "expectedOutput",
    "code",
    "allowlist",
    "scope",
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "const",
    "pattern",
    "$ref",
    "$id",
    "$defs",
    "definitions",
    "additionalProperties",
    "minimum",
    "maximum",
    "maxLength",
    "format",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "text",
    "slug",
    "approved",
    "safety",
    "correctness",
    "determinism",
    "boundedness",
    "confidence",
    "reasoning",
];

const STRINGS: &[&str] = &[
    "",
    "object",
    "string",
    "number",
    "integer",
    "array",
    "boolean",
    "null",
    "compose",
    "sandbox",
    "pipeline",
    "js",
    "upper_case",
    "word_count",
    "forge_tool",
    "slugify",
    "$input",
    "$input.text",
    "$input.",
    "$prev",
    "$prev.text",
    "$prev.0.x",
    "$steps",
    "$steps.up",
    "$steps.up.text",
    "$steps..",
    "Say: $prev.text and $input.text",
    "$$",
    "$",
    "#",
    "#/definitions/a",
    "#/$defs/a",
    "http://example.com/s",
    "(a+)+$",
    "[",
    "\\",
    "(?<n>x)\\k<n>",
    "^\\p{L}+$",
    "date-time",
    "email",
    "function execute(input){ return { slug: input.text }; }",
    "function execute(",
    "{\"approved\":true}",
    "```json",
    "é✓\u{1}",
    "\u{feff}",
    "NaN",
    "-0",
    "1e400",
    "fetch",
    "crypto",
    "Fn Name!",
];

fn random_value(rng: &mut Rng, depth: usize) -> Value {
    let leaf = depth >= 5 || rng.below(3) == 0;
    match if leaf { rng.below(5) } else { 5 + rng.below(2) } {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => rng.pick(&[json!(0), json!(-1), json!(1.5), json!(1e300), json!(-1e300), json!(u64::MAX), json!(i64::MIN), json!(2), json!(32)]).clone(),
        3 | 4 => Value::String(rng.pick(STRINGS).to_string()),
        5 => Value::Array((0..rng.below(4)).map(|_| random_value(rng, depth + 1)).collect()),
        _ => {
            let mut map = Map::new();
            for _ in 0..rng.below(5) {
                map.insert(rng.pick(KEYS).to_string(), random_value(rng, depth + 1));
            }
            Value::Object(map)
        }
    }
}

/// `base` with one node replaced, one key dropped, or one array entry repeated.
fn mutate(base: &Value, rng: &mut Rng) -> Value {
    let mut out = base.clone();
    let mut node = &mut out;
    for _ in 0..rng.below(6) {
        let next_key = match node {
            Value::Object(m) if !m.is_empty() => Some(m.keys().nth(rng.below(m.len())).cloned().map(Ok)),
            Value::Array(a) if !a.is_empty() => Some(Some(Err(rng.below(a.len())))),
            _ => None,
        };
        node = match (next_key.flatten(), node) {
            (Some(Ok(k)), Value::Object(m)) => m.get_mut(&k).expect("key just listed"),
            (Some(Err(i)), Value::Array(a)) => &mut a[i],
            (_, n) => n,
        };
    }
    match (rng.below(3), node) {
        (0, Value::Object(m)) if !m.is_empty() => {
            let k = m.keys().nth(rng.below(m.len())).cloned().expect("non-empty");
            m.remove(&k);
        }
        (1, Value::Array(a)) if !a.is_empty() => {
            let copy = a[rng.below(a.len())].clone();
            a.push(copy);
        }
        (_, n) => *n = random_value(rng, 2),
    }
    out
}

fn compose_request(name: &str) -> Value {
    json!({
        "name": name,
        "description": "Upper-case then count",
        "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] },
        "outputSchema": { "type": "object", "properties": { "count": { "type": "number" } }, "required": ["count"] },
        "implementation": { "mode": "compose", "steps": [
            { "name": "up", "tool": "upper_case", "inputMapping": { "text": "$input.text" } },
            { "name": "count", "tool": "word_count", "inputMapping": { "text": "Say: $steps.up.text" } }
        ] },
        "testCases": [
            { "input": { "text": "a b" }, "expectedOutput": { "count": 3 } },
            { "input": { "text": "one" }, "expectedOutput": { "count": 2 } }
        ]
    })
}

fn no_panic<T>(what: &str, input: &dyn std::fmt::Debug, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => panic!("{what} panicked on {input:?}"),
    }
}

#[test]
fn random_and_mutated_forge_requests_never_panic_and_the_registry_keeps_serving() {
    let r = rig();
    let mut rng = Rng(0x5eed_f0f0_1234_5678);
    let bases = [compose_request("counted"), slugify_request("slugged", "function execute(input){ return { slug: input.text }; }")];
    let mut outcomes: std::collections::BTreeMap<String, usize> = Default::default();
    for i in 0..iterations(1500) {
        let raw = if i % 5 == 0 { random_value(&mut rng, 0) } else { mutate(rng.pick(&bases), &mut rng) };
        no_panic("normalize/infer/shape_check", &raw, || {
            if let Ok(mut request) = normalize(&raw) {
                infer_schemas(&mut request);
                let _ = shape_check(&request);
            }
        });
        let result = no_panic("Registry::forge", &raw, || block_on(r.registry.forge(&raw, "s1")));
        let outcome = if result.success { "registered".to_string() } else { format!("{:?}", result.category) };
        *outcomes.entry(outcome).or_default() += 1;
        if result.success {
            let name = result.tool.as_ref().map(|t| t.name.clone()).unwrap_or_default();
            let args = random_value(&mut rng, 1);
            let _ = no_panic("calling a forged tool", &(&name, &args), || block_on(r.registry.call(&name, args.clone(), "s1")));
        }
    }
    // The inputs reach every stage: some register, others are refused at several of them.
    assert!(outcomes.get("registered").copied().unwrap_or(0) > 0 && outcomes.len() >= 4, "{outcomes:?}");
    // Still serving: a well-formed compose request forges and its tool answers.
    let ok = block_on(r.registry.forge(&compose_request("after_fuzz"), "s2"));
    assert!(ok.success, "{ok:?}");
}

#[test]
fn random_schemas_compile_or_fail_with_an_error_and_check_any_instance_without_panicking() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let fixed = [json!({ "$ref": "#" }), json!({ "$defs": { "a": { "$ref": "#/$defs/a" } }, "$ref": "#/$defs/a" }), json!({ "pattern": "(a+)+$" })];
    let mut compiled_count = 0;
    for i in 0..iterations(3000) {
        let schema = if i < fixed.len() { fixed[i].clone() } else { random_value(&mut rng, 0) };
        let Ok(compiled) = no_panic("CompiledSchema::compile", &schema, || CompiledSchema::compile(&schema)) else { continue };
        compiled_count += 1;
        for _ in 0..3 {
            let instance = random_value(&mut rng, 1);
            no_panic("CompiledSchema::check", &(&schema, &instance), || compiled.check(&instance).err());
        }
    }
    // Most random schemas are schemas: the checks ran, not only the compiler's refusals.
    assert!(compiled_count > 300, "{compiled_count} schemas compiled");
}

#[test]
fn model_text_never_panics_the_verdict_and_answer_parsers() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let pieces = [
        "{",
        "}",
        "[",
        "]",
        "\"",
        "\\",
        ":",
        ",",
        "```json\n",
        "```",
        "approved",
        "true",
        "0.9",
        "\"reasoning\"",
        "é",
        "\u{0}",
        " ",
        "\n",
        "{\"approved\":true,",
    ];
    let mut found = 0;
    for _ in 0..iterations(5000) {
        let text: String = (0..rng.below(24)).map(|_| *rng.pick(&pieces)).collect();
        no_panic("parse_verdict", &text, || parse_verdict(&text, &text).ok());
        if no_panic("extract_json", &text, || extract_json(&text)).is_some() {
            found += 1;
        }
        no_panic("json_values", &text, || json_values(&text));
    }
    // Some texts hold JSON the parsers find, so they are read past the first brace.
    assert!(found > 50, "JSON found in {found} texts");
}

#[test]
fn random_stream_chunks_assemble_into_a_response_or_a_protocol_error() {
    let mut rng = Rng(0x0f0f_0f0f_1357_9bdf);
    for _ in 0..iterations(3000) {
        let mut assembler = ResponseAssembler::new();
        let chunks: Vec<ModelChunk> = (0..rng.below(12))
            .map(|_| match rng.below(3) {
                0 => ModelChunk::Text { delta: rng.pick(STRINGS).to_string() },
                1 => ModelChunk::ToolCall {
                    index: *rng.pick(&[0, 1, 7, 127, 128, 4096, u32::MAX]),
                    id: rng.below(2).eq(&0).then(|| rng.pick(STRINGS).to_string()),
                    name: rng.below(2).eq(&0).then(|| rng.pick(STRINGS).to_string()),
                    arguments_delta: rng.pick(&["", "{", "\"text\":", "\"a\"", "}", "null", "[1,", "{\"x\":1}"]).to_string(),
                    provider_data: rng.below(2).eq(&0).then(|| json!({ "signature": rng.pick(STRINGS) })),
                },
                _ => ModelChunk::Finish { finish_reason: rng.pick(&["stop", "tool_calls", "length", ""]).to_string(), usage: None },
            })
            .collect();
        no_panic("ResponseAssembler", &chunks, || {
            for chunk in &chunks {
                assembler.push(chunk);
            }
            assembler.finish("call").ok()
        });
    }
}

/// YAML packages come from anyone: byte- and line-level mutations of a real export go through
/// `import` (the YAML reader, the alias budget, the package shapes, then the forge).
#[test]
fn mutated_tool_packages_import_or_fail_with_an_error_without_panicking() {
    let r = rig_with(
        crucible::registry::EmergentConfig { persist_sandbox_source: true, ..Default::default() },
        Some(approving_judge()),
        None,
        std::rc::Rc::new(crucible::store::MemoryStore::new()),
    );
    assert!(block_on(r.registry.forge(&compose_request("pkg_tool"), "s1")).success);
    let package = r.registry.export("pkg_tool", "s1").unwrap();
    let lines: Vec<&str> = package.lines().collect();
    let yaml_bits =
        ["&a ", "*a", "<<: *a", "!!binary ", "!!str", "? ", "- ", ": ", "{", "}", "[", "]", "|", ">-", "'", "\"", "#", "\t", "%YAML 1.2", "---", "...", "~"];
    let mut rng = Rng(0xa11a_5e5e_d00d_f00d);
    let mut imported = 0;
    for _ in 0..iterations(1500) {
        let mutated = match rng.below(3) {
            0 => {
                let mut bytes = package.clone().into_bytes();
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(bytes.len());
                    bytes[at] = *rng.pick(b"{}[]:-&*!|>'\"#\n \t0aZ\\%?");
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
            1 => {
                let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
                let at = rng.below(out.len());
                match rng.below(3) {
                    0 => drop(out.remove(at)),
                    1 => out.insert(at, out[rng.below(out.len())].clone()),
                    _ => out[at] = format!("{}{}", out[at], rng.pick(&yaml_bits)),
                }
                out.join("\n")
            }
            _ => (0..rng.below(30)).map(|_| *rng.pick(&yaml_bits)).collect::<Vec<_>>().join(if rng.below(2) == 0 { "\n" } else { "" }),
        };
        if no_panic("Registry::import", &mutated, || block_on(r.registry.import(&mutated, "s2"))).is_ok_and(|res| res.success) {
            imported += 1;
        }
    }
    // Harmless mutations (inside a description, a trailing comment) still import.
    assert!(imported > 0, "no mutated package imported: the mutations never reach the forge");
}

/// Model-written code is token soup often enough: random programs through the sandbox's
/// validation, Boa's parser and, when they parse, its engine. A panic there would trap the
/// sandbox Worker (it is replaced), which a model could repeat to keep Workers restarting.
#[test]
fn random_programs_never_panic_the_sandbox() {
    use crucible::sandbox::SandboxStatus;
    use support::sandbox::{run, runner};
    let tokens = [
        "function",
        "execute",
        "(",
        ")",
        "{",
        "}",
        "[",
        "]",
        "input",
        "input.a",
        "return",
        ";",
        ",",
        ".",
        "=>",
        "=",
        "+",
        "-",
        "*",
        "/",
        "/a+/g",
        "`",
        "${",
        "'x'",
        "\"y\"",
        "1",
        "0x1",
        "1n",
        "...",
        "?",
        ":",
        "?.",
        "??",
        "async",
        "await",
        "class",
        "extends",
        "super",
        "new",
        "this",
        "let",
        "const",
        "var",
        "x",
        "y",
        "if",
        "else",
        "try",
        "catch",
        "finally",
        "throw",
        "typeof",
        "delete",
        "in",
        "of",
        "instanceof",
        "\\u0065",
        "#p",
        "static",
        "get",
        "set",
        "import",
        "export",
        "break",
        "continue",
        "switch",
        "case",
        "default",
        "\n",
        "//c\n",
        "/*c*/",
        "arguments",
        "eval",
        "Symbol",
        "Proxy",
        "Reflect",
        "Object",
        "Array",
        "JSON",
        "Math",
        "Promise",
        "then",
        "constructor",
        "__proto__",
        "prototype",
    ];
    let sandbox = runner();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut ran = 0;
    for _ in 0..iterations(2000) {
        let body: Vec<&str> = (0..rng.below(40)).map(|_| *rng.pick(&tokens)).collect();
        let code = format!("function execute(input){{ {} }}", body.join(" "));
        let result = no_panic("the sandbox", &code, || run(&sandbox, &code, json!({ "a": 1 })));
        if matches!(result.status, SandboxStatus::Ok) || result.error.as_ref().is_some_and(|e| e.code == "runtime_error") {
            ran += 1;
        }
    }
    assert!(ran > 0, "no random program got past the parser");
}

/// A model's answers, turn after turn: random text and tool calls (unknown names, garbled or
/// hostile arguments, `forge_tool` with mutated requests, calls of what it forged) through
/// whole runs of an agent whose registry is attached. Each run ends with an answer or a typed
/// error, and the agent answers a normal run afterwards.
#[test]
fn random_model_turns_never_panic_a_run_with_forging_enabled() {
    use crucible::agent::{Agent, AgentConfig, CollectingSink, NativeEnvironment, RunOptions, ToolProvider};
    use support::{Reply, ScriptedModel};

    let r = rig();
    let mut rng = Rng(0xfeed_face_dead_c0de);
    let forge_base = compose_request("fuzzed");
    let names = ["upper_case", "word_count", "forge_tool", "fuzzed", "missing", "", "upper_case\u{0}", "Fn Name!"];
    let mut answered = 0;
    for i in 0..iterations(300) {
        let turns: Vec<Reply> = (0..1 + rng.below(5))
            .map(|_| match rng.below(4) {
                0 => Reply::Text(rng.pick(STRINGS).to_string()),
                1 => {
                    let request = if rng.below(2) == 0 { mutate(&forge_base, &mut rng) } else { forge_base.clone() };
                    Reply::Calls(vec![("forge_tool".into(), request.to_string())])
                }
                _ => Reply::Calls(
                    (0..1 + rng.below(3))
                        .map(|_| {
                            let args = match rng.below(3) {
                                0 => random_value(&mut rng, 1).to_string(),
                                1 => json!({ "text": rng.pick(STRINGS) }).to_string(),
                                _ => rng.pick(&["", "{", "null", "[1,2]", "{\"text\":", "not json"]).to_string(),
                            };
                            (rng.pick(&names).to_string(), args)
                        })
                        .collect(),
                ),
            })
            .collect();
        let model = ScriptedModel::new(turns);
        let agent =
            Agent::new(AgentConfig { max_turns: 6, ..Default::default() }, model, host_tools(), std::rc::Rc::new(NativeEnvironment::default())).unwrap();
        agent.set_tool_provider(Some(r.registry.clone() as std::rc::Rc<dyn ToolProvider>));
        let options = RunOptions { session_id: Some(format!("run{}", i % 7)), ..Default::default() };
        if no_panic("Agent::run", &i, || block_on(agent.run("go", options, &mut CollectingSink::default()))).is_ok() {
            answered += 1;
        }
    }
    // The turns reach the forge (some register, others are refused) and some runs answer.
    let stats = r.registry.stats();
    assert!(stats.approved > 0 && stats.rejected > 0 && answered > 0, "{stats:?}, {answered} answered");
    let model = ScriptedModel::new(vec![support::call("upper_case", r#"{"text":"ok"}"#), support::text("done")]);
    let agent = Agent::new(AgentConfig::default(), model, host_tools(), std::rc::Rc::new(NativeEnvironment::default())).unwrap();
    agent.set_tool_provider(Some(r.registry.clone() as std::rc::Rc<dyn ToolProvider>));
    let out = block_on(agent.run("go", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert_eq!(out.text, "done");
}

/// Strings YAML reads as something else when written plainly (booleans, nulls, numbers, dates,
/// anchors, tags, comments, document markers, indentation-sensitive text).
const YAML_TRICKY: &[&str] = &[
    "yes",
    "no",
    "on",
    "off",
    "true",
    "False",
    "null",
    "~",
    "",
    "1e3",
    "0x10",
    "010",
    "0o7",
    "-0",
    ".inf",
    "-.Inf",
    ".NaN",
    "1_000",
    "2024-01-01",
    "12:30:45",
    ": x",
    "- a",
    "#c",
    "a #b",
    "'q'",
    "\"d\"",
    "a: b",
    "? k",
    " lead",
    "trail ",
    "\t",
    "tab\there",
    "two\nlines",
    "\r\n",
    "---",
    "...",
    "%YAML",
    "@at",
    "`tick`",
    "!tag",
    "&anchor",
    "*alias",
    "{a: 1}",
    "[1, 2]",
    "|",
    ">-",
    "\\",
    "é ✓ 漢",
    "\u{feff}bom",
    "\u{85}nel",
    "\u{2028}",
    "\u{0}nul",
    "\u{7f}",
];

/// Every forged tool exports to a package that imports again, with the same content hash and
/// the same answers, whatever its strings are: descriptions, schema annotations, test inputs
/// and expected outputs that YAML would read as booleans, numbers, nulls or structure if they
/// were written without quoting, and sandbox code with such text in it.
#[test]
fn forged_tools_with_yaml_tricky_strings_export_and_import_with_the_same_hash() {
    let r = rig_with(
        crucible::registry::EmergentConfig { persist_sandbox_source: true, max_session_tools: 100_000, ..Default::default() },
        Some(approving_judge()),
        None,
        std::rc::Rc::new(crucible::store::MemoryStore::new()),
    );
    let mut rng = Rng(0x00dd_ba11_5eed_0001);
    for i in 0..iterations(300) {
        let [a, b, c, d] = [0; 4].map(|_| rng.pick(YAML_TRICKY).to_string());
        let text_schema = json!({ "type": "object", "properties": { "text": { "type": "string", "description": c } }, "required": ["text"] });
        let name = format!("round_trip_{i}");
        let request = if rng.below(2) == 0 {
            json!({
                "name": name, "description": format!("Upper-cases {a}"), "inputSchema": text_schema, "outputSchema": text_schema,
                "implementation": { "mode": "compose", "steps": [{ "name": "up", "tool": "upper_case", "inputMapping": { "text": "$input.text" } }] },
                "testCases": [
                    { "input": { "text": b }, "expectedOutput": { "text": b.to_uppercase() } },
                    { "input": { "text": d }, "expectedOutput": { "text": d.to_uppercase() } }
                ]
            })
        } else {
            let slug_schema = json!({ "type": "object", "properties": { "slug": { "type": "string", "description": c } }, "required": ["slug"] });
            json!({
                "name": name, "description": format!("Slugifies {a}"), "inputSchema": text_schema, "outputSchema": slug_schema,
                "implementation": { "mode": "sandbox", "code": format!("// SLUGIFY {b}\n{d}\nfunction execute(input) {{ return {{ slug: input.text }}; }}\n") },
                "testCases": [{ "input": { "text": b } }, { "input": { "text": d } }]
            })
        };
        let forged = block_on(r.registry.forge(&request, "s1"));
        assert!(forged.success, "{request} did not forge: {forged:?}");
        let hash = forged.tool.as_ref().map(|t| t.hash.clone()).unwrap_or_default();
        let package = r.registry.export(&name, "s1").unwrap();
        let imported = block_on(r.registry.import(&package, "s2")).unwrap_or_else(|e| panic!("{e}\n{package}"));
        assert!(imported.success, "{imported:?}\n{package}");
        assert_eq!(imported.tool.as_ref().map(|t| t.hash.clone()), Some(hash), "{package}");
        let args = json!({ "text": b });
        assert_eq!(block_on(r.registry.call(&name, args.clone(), "s2")), block_on(r.registry.call(&name, args, "s1")));
    }
}

/// Pieces of compose mapping syntax and the text around it that parsers trip on: escapes,
/// roots, brackets and quotes left open, multi-byte characters next to every boundary.
const MAPPING_PIECES: &[&str] = &[
    "$",
    "$$",
    "$$$",
    "$input",
    "$prev",
    "$steps.",
    "$steps[",
    "${",
    "${input",
    "${prev.",
    "${steps.",
    "[",
    "]",
    "[0]",
    "[99999999999999999999]",
    "[-1]",
    "[\"",
    "\"]",
    "[\"first-name\"]",
    "['",
    "']",
    "['a.b']",
    "\"",
    "'",
    "\\",
    ".",
    "..",
    "-",
    "_",
    "0",
    "7",
    "text",
    "items",
    "first",
    "a.b",
    "é",
    "e\u{301}",
    "😀",
    "título",
    "{",
    "}",
    " ",
    "\u{0}",
    "\n",
];

/// A mapping string of random syntax pieces.
fn mapping_text(rng: &mut Rng) -> String {
    (0..1 + rng.below(10)).map(|_| *rng.pick(MAPPING_PIECES)).collect()
}

/// A step mapping: one string as the whole mapping, or an object whose values nest strings.
fn mapping_value(rng: &mut Rng, depth: usize) -> Value {
    match if depth >= 3 { 0 } else { rng.below(4) } {
        0 | 1 => Value::String(mapping_text(rng)),
        2 => Value::Array((0..rng.below(3)).map(|_| mapping_value(rng, depth + 1)).collect()),
        _ => Value::Object((0..rng.below(3)).map(|_| (mapping_text(rng), mapping_value(rng, depth + 1))).collect()),
    }
}

/// Generated compose mappings, built through the forge's compose builder and called: the build
/// succeeds or refuses the mapping with a compose build error, and a built pipeline answers or
/// fails with a tool failure. Any string escaped with `$$` is the literal it escapes.
#[test]
fn generated_compose_mappings_build_or_are_refused_and_calls_answer_or_fail_typed() {
    use crucible::forge::{ComposeBuildError, ComposeHandler, ComposeStep};
    use crucible::tools::{CallContext, Tool, ToolHandler, ToolLookup};

    let mut tools = host_tools();
    tools.insert(Tool::new("echo", "Returns its arguments", &json!({}), None, support::FnTool::new(Ok)).unwrap());
    let tools: std::rc::Rc<dyn ToolLookup> = std::rc::Rc::new(tools);
    let names = ["first", "a.b", "é", "😀", "0", "x-y", "step 1"];
    let inputs = [json!({ "text": "Hi", "first-name": "Ada", "items": [{ "id": 7 }], "é": "e", "a.b": 1 }), json!([1, "😀"]), json!("é"), json!(null)];
    let mut rng = Rng(0x0c0f_fee0_d011_a125);
    let (mut built, mut refused, mut answered) = (0, 0, 0);
    for _ in 0..iterations(4000) {
        let steps: Vec<ComposeStep> = (0..1 + rng.below(3))
            .map(|_| {
                let mapping = if rng.below(3) == 0 { Value::String(mapping_text(&mut rng)) } else { json!({ "text": mapping_value(&mut rng, 1) }) };
                ComposeStep { name: rng.pick(&names).to_string(), tool: rng.pick(&["echo", "echo", "upper_case"]).to_string(), input_mapping: mapping }
            })
            .collect();
        let handler = match no_panic("ComposeHandler::build", &steps, || ComposeHandler::build("fuzzed", &steps, tools.clone(), "s1")) {
            Ok(handler) => handler,
            Err(ComposeBuildError::BadMapping { reason, .. }) => {
                assert!(reason.contains('`'), "a refusal quotes what to write: {reason} for {steps:?}");
                refused += 1;
                continue;
            }
            Err(ComposeBuildError::UnknownStepReference { .. } | ComposeBuildError::DuplicateStep(_)) => continue,
            Err(other) => panic!("{other} for {steps:?}"),
        };
        built += 1;
        let input = rng.pick(&inputs).clone();
        match no_panic("ComposeHandler::call", &(&steps, &input), || block_on(handler.call(input.clone(), &CallContext::new("", "c", "s1")))) {
            Ok(_) => answered += 1,
            Err(f) => assert!(["execution_failed", "invalid_arguments", "invalid_output"].contains(&f.code.as_str()), "{f:?} for {steps:?}"),
        }

        // `$$` escapes every `$`: the escaped text reaches the step as it was.
        let text = mapping_text(&mut rng);
        let step = ComposeStep { name: "e".into(), tool: "echo".into(), input_mapping: json!({ "text": text.replace('$', "$$") }) };
        let escaped = ComposeHandler::build("escaped", &[step], tools.clone(), "s1").unwrap_or_else(|e| panic!("{e} for {text:?}"));
        assert_eq!(block_on(escaped.call(json!({}), &CallContext::default())), Ok(json!({ "text": text })));
    }
    // The generator reaches every outcome, not only refusals.
    assert!(built > 100 && refused > 100 && answered > 50, "built {built}, refused {refused}, answered {answered}");
}
