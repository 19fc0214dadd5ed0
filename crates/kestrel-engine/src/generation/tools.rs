//! Tool calls: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`, in the syntax the
//! model's chat template teaches it. The template shows the tools to the model; the model's
//! calls are held to the tools' names and parameter schemas by a grammar (constraint.rs); the
//! calls are cut out of the output text into [`ToolCall`]s, and the text of a call is not
//! streamed as content.
//!
//! Two syntaxes, told apart by the template's source:
//! - Hermes (Qwen2.5, Qwen3, SmolLM3, Hermes, and every template that does not know tools, which
//!   are shown the tools in Qwen's own system-prompt wording):
//!   `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one block per call.
//! - Llama 3.1+: one JSON object `{"name": "f", "parameters": {...}}` as the whole answer.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use kestrel_tokenizer::{python_json, ChatMessage};

/// Most tools one request may give.
pub const MAX_TOOLS: usize = 128;

/// One entry of `tools`: a function the model may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    pub function: FunctionTool,
}

/// `type: "function"`, the one kind of tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FunctionKind {
    Function,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionTool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema of the arguments object; none takes any object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Accepted; the arguments are always held to `parameters`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name"}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(ToolMode),
    Named(NamedTool),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolMode {
    /// No call: the tools are not shown to the model.
    None,
    /// Text or calls, as the model chooses (the default when tools are given).
    Auto,
    /// At least one call.
    Required,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedTool {
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    pub function: ToolName,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolName {
    pub name: String,
}

/// A call the model made, in OpenAI's shape: `{id, type: "function", function: {name,
/// arguments}}`, the arguments as JSON text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// How a model writes its calls, from its chat template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// `<tool_call>\n{"name", "arguments"}\n</tool_call>` blocks. `template_knows_tools`: the
    /// template renders `tools` and assistant `tool_calls` itself; otherwise Kestrel writes them
    /// into the messages.
    Hermes { template_knows_tools: bool },
    /// One `{"name", "parameters"}` object (Llama 3.1 and later).
    LlamaJson,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";

impl ToolSyntax {
    /// The syntax a template (`tokenizer.chat_template`; None: Kestrel's ChatML fallback) teaches.
    pub fn of_template(source: Option<&str>) -> Self {
        let source = source.unwrap_or("");
        if source.contains(HERMES_OPEN) {
            ToolSyntax::Hermes { template_knows_tools: true }
        } else if source.contains("<|python_tag|>") || (source.contains("<|eot_id|>") && source.contains("\"parameters\": ")) {
            ToolSyntax::LlamaJson
        } else {
            ToolSyntax::Hermes { template_knows_tools: false }
        }
    }
}

/// A request's tool settings, once checked: which tools the model is shown and what it must do.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ToolUse<'a> {
    pub(super) tools: &'a [Tool],
    /// Only this tool may be called, and once.
    pub(super) named: Option<&'a str>,
    pub(super) required: bool,
    pub(super) parallel: bool,
}

impl ToolUse<'_> {
    /// The tools as the template variable `tools` (OpenAI's shape).
    pub(crate) fn template_value(&self) -> Value {
        serde_json::to_value(self.tools).unwrap_or(Value::Null)
    }

    /// The Lark grammar (llguidance's syntax) a model writing `syntax` is held to: free text or
    /// calls (`auto`), or calls only (`required`, a named tool). A call names a tool of the
    /// request and its arguments follow the tool's `parameters`.
    pub(crate) fn grammar(&self, syntax: ToolSyntax) -> String {
        let args_key = match syntax {
            ToolSyntax::Hermes { .. } => "arguments",
            ToolSyntax::LlamaJson => "parameters",
        };
        let calls: Vec<Value> = self
            .tools
            .iter()
            .filter(|t| self.named.is_none_or(|n| n == t.function.name))
            .map(|t| {
                let params = t.function.parameters.clone().unwrap_or_else(|| json!({ "type": "object" }));
                json!({
                    "type": "object",
                    "properties": { "name": { "const": t.function.name }, args_key: params },
                    "required": ["name", args_key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = json!({ "anyOf": calls, "x-guidance": { "whitespace_pattern": super::constraint::JSON_WHITESPACE } });
        let once = self.named.is_some() || !self.parallel;
        match syntax {
            ToolSyntax::Hermes { .. } => {
                let more = if once { "" } else { " (\"\\n\" call)*" };
                let start = if self.required { format!("start: call{more}") } else { format!("start: TEXT | lead rest{more}") };
                format!(
                    "%llguidance {{}}\n{start}\ncall: \"{HERMES_OPEN}\" rest\nrest: \"\\n\" args \"\\n{HERMES_CLOSE}\"\n\
                     lead[lazy]: /(?s:.*){HERMES_OPEN}/\nTEXT: /(?s:.*)/\nargs: %json {schema}\n"
                )
            }
            // Llama 3.1 calls one function at a time (its template refuses more).
            ToolSyntax::LlamaJson => {
                let start = if self.required { "start: args" } else { "start: args | TEXT" };
                format!("%llguidance {{}}\n{start}\nTEXT: /([^{{](?s:.*))?/\nargs: %json {schema}\n")
            }
        }
    }

    /// The messages as the template should see them. A template that knows tools gets them as
    /// they are. Any other is shown the tools in a system message, the assistant's earlier calls
    /// as `<tool_call>` blocks in its text, and tool results as a user turn of
    /// `<tool_response>` blocks (Qwen2.5's own wording and layout).
    pub(crate) fn messages<'m>(&self, syntax: ToolSyntax, messages: &'m [ChatMessage]) -> Cow<'m, [ChatMessage]> {
        if syntax != (ToolSyntax::Hermes { template_knows_tools: false }) {
            return Cow::Borrowed(messages);
        }
        let listing: Vec<String> = self.tools.iter().map(|t| python_json(&json!(t), None)).collect();
        let instructions = format!(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
             You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{}\n</tools>\n\n\
             For each function call, return a json object with function name and arguments within \
             <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
            listing.join("\n")
        );
        let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
        match messages.first() {
            Some(first) if first.role == "system" => out.push(ChatMessage::new("system", format!("{}\n\n{instructions}", first.content))),
            _ => out.push(ChatMessage::new("system", instructions)),
        }
        let rest = if messages.first().is_some_and(|m| m.role == "system") { &messages[1..] } else { messages };
        for message in rest {
            match message.role.as_str() {
                "tool" => {
                    let block = format!("<tool_response>\n{}\n</tool_response>", message.content);
                    match out.last_mut() {
                        Some(last) if last.role == "user" && last.content.ends_with("</tool_response>") => {
                            last.content.push('\n');
                            last.content.push_str(&block);
                        }
                        _ => out.push(ChatMessage::new("user", block)),
                    }
                }
                "assistant" if !message.tool_calls.is_empty() => {
                    let mut text = message.content.clone();
                    for call in &message.tool_calls {
                        let body = json!({ "name": call.function.name, "arguments": call.function.arguments });
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&format!("{HERMES_OPEN}\n{}\n{HERMES_CLOSE}", python_json(&body, None)));
                    }
                    out.push(ChatMessage::new("assistant", text));
                }
                _ => out.push(ChatMessage::new(message.role.clone(), message.content.clone())),
            }
        }
        Cow::Owned(out)
    }
}

/// Splits a streamed output into the content shown as it comes and the text of its calls, which
/// is held until the end: the opening of a call (and any text that may yet become one) is not
/// streamed.
#[derive(Debug)]
pub(crate) struct CallSplitter {
    syntax: ToolSyntax,
    /// Text not yet shown: a possible start of a call.
    held: String,
    /// A call has begun: nothing more is content.
    in_call: bool,
    /// The output is past the point where a call could begin (Llama's JSON starts the answer).
    settled: bool,
}

impl CallSplitter {
    pub fn new(syntax: ToolSyntax) -> Self {
        Self { syntax, held: String::new(), in_call: false, settled: false }
    }

    /// The content to show now from the next piece of output text.
    pub fn push(&mut self, text: &str) -> String {
        if self.in_call {
            return String::new();
        }
        if self.settled {
            return text.to_string();
        }
        self.held.push_str(text);
        match self.syntax {
            ToolSyntax::LlamaJson => {
                let rest = self.held.trim_start();
                if rest.is_empty() {
                    String::new()
                } else if rest.starts_with('{') {
                    self.in_call = true;
                    String::new()
                } else {
                    self.settled = true;
                    std::mem::take(&mut self.held)
                }
            }
            ToolSyntax::Hermes { .. } => {
                if let Some(at) = self.held.find(HERMES_OPEN) {
                    self.in_call = true;
                    let shown = self.held[..at].to_string();
                    self.held.clear();
                    return shown;
                }
                // Hold back the longest tail that could still open a call.
                let keep = (1..HERMES_OPEN.len())
                    .rev()
                    .find(|&n| {
                        self.held.len() >= n
                            && self.held.is_char_boundary(self.held.len() - n)
                            && HERMES_OPEN.starts_with(&self.held[self.held.len() - n..])
                    })
                    .unwrap_or(0);
                let shown = self.held[..self.held.len() - keep].to_string();
                self.held.drain(..self.held.len() - keep);
                shown
            }
        }
    }

    /// At the end: the text still held back that is content: none once a call began, nor the
    /// start of a call's opening that the output ended in (cut off by `max_tokens`; it is the
    /// model's call syntax, never content).
    pub fn finish(&mut self) -> String {
        let held = std::mem::take(&mut self.held);
        let opening = matches!(self.syntax, ToolSyntax::Hermes { .. }) && !held.is_empty() && HERMES_OPEN.starts_with(held.as_str());
        if self.in_call || opening {
            String::new()
        } else {
            held
        }
    }

    pub fn in_call(&self) -> bool {
        self.in_call
    }
}

/// The content and the calls of a whole output `text` in `syntax`. Calls are taken up to the first
/// that does not parse: one cut off by `max_tokens` (the grammar lets nothing else be unparsable),
/// which is dropped with the rest, so the model's call syntax never shows as content, as OpenAI's
/// streamed deltas of a cut call carry no content either (the finish reason says `length`). A call
/// naming no tool of the request leaves the whole text as content and no call. The content is the
/// text streamed before the first call. `seed` makes the calls' ids (with their index).
pub(crate) fn split_calls(syntax: ToolSyntax, tools: &[Tool], text: &str, seed: u64) -> (String, Vec<ToolCall>) {
    let whole = || (text.to_string(), Vec::new());
    let known = |name: &str| tools.iter().any(|t| t.function.name == name);
    let mut calls = Vec::new();
    let content = match syntax {
        ToolSyntax::LlamaJson => {
            let Ok(Value::Object(body)) = serde_json::from_str::<Value>(text.trim()) else {
                // The grammar's text answers never start with `{`: one that does is a cut call.
                return if text.trim_start().starts_with('{') { (String::new(), Vec::new()) } else { whole() };
            };
            match call_of(&body, "parameters") {
                Some(call) if known(&call.0) => calls.push(call),
                _ => return whole(),
            }
            String::new()
        }
        ToolSyntax::Hermes { .. } => {
            let Some(first) = text.find(HERMES_OPEN) else { return whole() };
            let mut rest = &text[first..];
            while let Some(open) = rest.find(HERMES_OPEN) {
                match hermes_block(rest, open) {
                    Some((Some(call), end)) if known(&call.0) => {
                        calls.push(call);
                        rest = &rest[end..];
                    }
                    Some(_) => return whole(),
                    // Cut off: dropped.
                    None => {
                        rest = "";
                        break;
                    }
                }
            }
            if !rest.trim().is_empty() {
                return whole();
            }
            text[..first].to_string()
        }
    };
    // A call repeated with the same arguments is one call (a small model repeats itself; the
    // generation stops at the first repeat, see `repeats_a_call`).
    let mut distinct: Vec<(String, String)> = Vec::with_capacity(calls.len());
    for call in calls {
        if !distinct.contains(&call) {
            distinct.push(call);
        }
    }
    let calls = distinct
        .into_iter()
        .enumerate()
        .map(|(i, (name, arguments))| ToolCall {
            id: format!("call_{:016x}", fnv1a(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15), text.as_bytes())),
            kind: FunctionKind::Function,
            function: FunctionCall { name, arguments },
        })
        .collect();
    (content, calls)
}

/// Whether the output `text` so far, which has just closed a call, holds a call that repeats an
/// earlier one (the same tool, the same arguments): then the generation ends there, since a model
/// that repeats a call is looping, and the repeat is dropped (`split_calls`).
pub(crate) fn repeats_a_call(syntax: ToolSyntax, tools: &[Tool], text: &str) -> bool {
    let ToolSyntax::Hermes { .. } = syntax else { return false };
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(HERMES_OPEN) {
        let Some((call, end)) = hermes_block(rest, open) else { return false };
        match call {
            Some(call) if tools.iter().any(|t| t.function.name == call.0) => {
                if seen.contains(&call) {
                    return true;
                }
                seen.push(call);
            }
            _ => return false,
        }
        rest = &rest[end..];
    }
    false
}

/// The `<tool_call>` block that opens at `open` in `rest`: its call (None where its JSON names no
/// call) and where the block ends; None where it is not closed or its body is no JSON object (cut
/// off).
fn hermes_block(rest: &str, open: usize) -> Option<(Option<(String, String)>, usize)> {
    let body_start = open + HERMES_OPEN.len();
    let close = rest[body_start..].find(HERMES_CLOSE)?;
    match serde_json::from_str::<Value>(rest[body_start..body_start + close].trim()) {
        Ok(Value::Object(body)) => Some((call_of(&body, "arguments"), body_start + close + HERMES_CLOSE.len())),
        _ => None,
    }
}

/// A call's name and its arguments as JSON text, from `{"name", <args_key>}`.
fn call_of(body: &Map<String, Value>, args_key: &str) -> Option<(String, String)> {
    let name = body.get("name")?.as_str()?.to_string();
    let arguments = body.get(args_key).or_else(|| body.get("arguments")).cloned().unwrap_or_else(|| json!({}));
    Some((name, arguments.to_string()))
}

/// The seed of a generation's call ids: its prompt's tokens, hashed.
pub(crate) fn call_seed(prompt: &[u32]) -> u64 {
    let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
    fnv1a(0, &bytes)
}

fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325 ^ seed, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Tool {
        Tool {
            kind: FunctionKind::Function,
            function: FunctionTool { name: name.into(), description: None, parameters: Some(json!({"type": "object"})), strict: None },
        }
    }

    #[test]
    fn hermes_blocks_split_into_content_and_calls() {
        let tools = [tool("get_weather"), tool("add")];
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let (content, calls) = split_calls(ToolSyntax::Hermes { template_knows_tools: true }, &tools, text, 7);
        assert_eq!(content, "Let me look.\n");
        let got: Vec<(&str, &str)> = calls.iter().map(|c| (c.function.name.as_str(), c.function.arguments.as_str())).collect();
        assert_eq!(got, [("get_weather", r#"{"city":"Oslo"}"#), ("add", r#"{"a":1}"#)]);
        assert_ne!(calls[0].id, calls[1].id);
    }

    #[test]
    fn a_cut_call_is_dropped_and_an_unknown_one_stays_text() {
        let tools = [tool("add")];
        let hermes = ToolSyntax::Hermes { template_knows_tools: true };
        // Cut by max_tokens: no call, and none of its syntax in the content.
        assert_eq!(split_calls(hermes, &tools, "Sure.\n<tool_call>\n{\"", 0), ("Sure.\n".to_string(), Vec::new()));
        let unknown = "<tool_call>\n{\"name\": \"sub\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(split_calls(hermes, &tools, unknown, 0), (unknown.to_string(), Vec::new()));
        // The calls before a cut one are kept.
        let cut = "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"a";
        let (content, calls) = split_calls(hermes, &tools, cut, 0);
        assert_eq!((content.as_str(), calls.len()), ("", 1));
        let (content, calls) = split_calls(ToolSyntax::LlamaJson, &tools, " {\"name\": \"add\", \"parameters\": {\"a\": 2}}", 0);
        assert_eq!((content.as_str(), calls[0].function.arguments.as_str()), ("", r#"{"a":2}"#));
        assert_eq!(split_calls(ToolSyntax::LlamaJson, &tools, " {\"name\": \"ad", 0), (String::new(), Vec::new()));
        assert!(split_calls(ToolSyntax::LlamaJson, &tools, "{\"a\": 2} is JSON", 0).1.is_empty());
    }

    #[test]
    fn a_repeated_call_ends_the_output_and_is_one_call() {
        let tools = [tool("add")];
        let hermes = ToolSyntax::Hermes { template_knows_tools: true };
        let call = |a: u32| format!("<tool_call>\n{{\"name\": \"add\", \"arguments\": {{\"a\": {a}}}}}\n</tool_call>");
        let two = format!("{}\n{}", call(1), call(2));
        assert!(!repeats_a_call(hermes, &tools, &two));
        let repeated = format!("{two}\n{}", call(1));
        assert!(repeats_a_call(hermes, &tools, &repeated));
        let (_, calls) = split_calls(hermes, &tools, &repeated, 0);
        let args: Vec<&str> = calls.iter().map(|c| c.function.arguments.as_str()).collect();
        assert_eq!(args, [r#"{"a":1}"#, r#"{"a":2}"#]);
    }

    #[test]
    fn the_splitter_streams_content_and_holds_a_call() {
        let mut s = CallSplitter::new(ToolSyntax::Hermes { template_knows_tools: true });
        let pieces = ["Sure", " <tool", "ing> ok <tool_", "call>\n{\"name\"", "}\n</tool_call>"];
        let shown: Vec<String> = pieces.iter().map(|p| s.push(p)).collect();
        assert_eq!(shown, ["Sure", " ", "<tooling> ok ", "", ""]);
        assert!(s.in_call());
        assert_eq!(s.finish(), "");
        // An output that ends inside a call's opening: cut off, and not content.
        let mut cut = CallSplitter::new(ToolSyntax::Hermes { template_knows_tools: true });
        assert_eq!([cut.push("Hi <to"), cut.push("ol_c")], ["Hi ", ""]);
        assert_eq!(cut.finish(), "");
        let mut llama = CallSplitter::new(ToolSyntax::LlamaJson);
        assert_eq!([llama.push(" "), llama.push("Hi {"), llama.push("x")], ["", " Hi {", "x"]);
    }

    #[test]
    fn syntax_comes_from_the_template() {
        assert_eq!(ToolSyntax::of_template(Some("{{ '<tool_call>' }}")), ToolSyntax::Hermes { template_knows_tools: true });
        assert_eq!(ToolSyntax::of_template(Some("<|python_tag|>")), ToolSyntax::LlamaJson);
        assert_eq!(ToolSyntax::of_template(None), ToolSyntax::Hermes { template_knows_tools: false });
    }
}
