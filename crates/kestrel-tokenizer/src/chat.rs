//! Chat templates (the Jinja templates stored in GGUF `tokenizer.chat_template`).

use std::sync::Mutex;

use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TokenizerError};
use crate::tokenizer::Tokenizer;

/// The template used when a model ships none: ChatML (`<|im_start|>role\n...<|im_end|>\n`),
/// the most widely used format among small instruct models and the one Kestrel's
/// default model (SmolLM2) uses. It adds no default system prompt. This is a fallback
/// only: a model that was not trained on ChatML will answer poorly with it, which is
/// why GGUF files should carry their own template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Instructions a render may execute, and values it may make, beyond what its input pays for
/// (`FUEL_PER_INPUT_BYTE`). With vendor/minijinja a unit of fuel also pays for 4 bytes of the
/// strings, lists and maps a template makes, so a runaway loop or a value doubled in one stops in
/// about 0.4 s natively, having made at most 20 MB (and one last value, at most a few times that).
const RENDER_FUEL: u64 = 5_000_000;

/// Fuel a render gets for each byte of its messages and tools: a template copies each message
/// into a few intermediate strings (the default model's, over 2,000 messages of 1 KiB, takes 1.6M
/// units, 0.8 a byte), and a long conversation must not run out where a short one would not.
const FUEL_PER_INPUT_BYTE: u64 = 2;

/// Deepest nesting of macro calls, includes and recursive loops. Templates in the wild nest a
/// handful of levels; each level costs several interpreter frames, and 500 (minijinja's own
/// limit) overflows the 1 MiB stack of a wasm worker before it is reached.
const RENDER_RECURSION_LIMIT: usize = 64;

/// Output a render may write beyond four times its messages' text: a prompt is the messages
/// plus a little markup per message, so only a runaway template comes near this.
const RENDER_OUTPUT_SLACK: usize = 4 << 20;

/// One chat message, as in OpenAI's API (`{"role": "user", "content": "..."}`), in the form chat
/// templates read: an assistant's `tool_calls` carry their arguments as a JSON value (Hugging
/// Face's convention; OpenAI's wire sends a string), a `tool` message the `tool_call_id` it
/// answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ChatToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// A call an assistant message made, as templates read it: `{id, type: "function", function:
/// {name, arguments}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: ChatFunctionCall,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatFunctionCall {
    pub name: String,
    /// The arguments object (a string only where the caller's text was not JSON).
    pub arguments: serde_json::Value,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }
}

/// A compiled chat template.
///
/// Rendering follows Hugging Face transformers (and llama.cpp's Jinja engine):
/// `trim_blocks` and `lstrip_blocks` on, Python string methods (`.strip()`,
/// `.startswith()`, `.split()`...) available, `raise_exception(msg)` fails the
/// render with `msg`, and the variables `messages`, `add_generation_prompt`,
/// `bos_token` and `eos_token` are set.
pub struct ChatTemplate {
    /// Locked while a render runs: each render sets its own fuel (see `FUEL_PER_INPUT_BYTE`).
    env: Mutex<Environment<'static>>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos_token", &self.bos_token).field("eos_token", &self.eos_token).finish_non_exhaustive()
    }
}

fn template_err(e: Error) -> TokenizerError {
    // Include the chain of causes: minijinja puts the useful detail there.
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    TokenizerError::Template(msg)
}

impl ChatTemplate {
    /// Compiles `template_src`; `bos_token` / `eos_token` are the texts the template
    /// sees as `bos_token` / `eos_token`.
    pub fn new(template_src: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // A chat template is code from whoever made the model file: bound its nesting (a recursion
        // limit low enough for a wasm worker's 1 MiB stack); its time and the values it makes
        // (fuel) and its output are bounded in `render`, by its input.
        env.set_recursion_limit(RENDER_RECURSION_LIMIT);
        env.add_filter("tojson", python_tojson);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", template_src.to_string()).map_err(template_err)?;
        Ok(Self { env: Mutex::new(env), bos_token: bos_token.to_string(), eos_token: eos_token.to_string() })
    }

    /// The ChatML fallback ([`CHATML_TEMPLATE`]).
    pub fn chatml() -> Self {
        // CHATML_TEMPLATE is a constant known to compile; fall back to an empty
        // environment rather than panic if that were ever not so.
        Self::new(CHATML_TEMPLATE, "", "").unwrap_or_else(|_| Self {
            env: Mutex::new(Environment::new()),
            bos_token: String::new(),
            eos_token: String::new(),
        })
    }

    /// The model's own template (GGUF `tokenizer.chat_template`) with its BOS/EOS
    /// texts; [`CHATML_TEMPLATE`] when the model has none.
    pub fn for_tokenizer(tok: &Tokenizer) -> Result<Self> {
        let src = tok.chat_template().unwrap_or(CHATML_TEMPLATE);
        Self::new(src, &tok.bos_text(), &tok.eos_text())
    }

    /// Renders the conversation. With `add_generation_prompt` the text ends with the
    /// opening of an assistant turn, ready for generation.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with the template variable `tools` set: the functions the model
    /// may call, in OpenAI's shape (`[{"type": "function", "function": {name, description,
    /// parameters}}]`), as Hugging Face's `apply_chat_template(tools=...)` passes them.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let calls: usize =
            messages.iter().flat_map(|m| &m.tool_calls).map(|c| c.function.name.len() + c.function.arguments.to_string().len()).sum();
        let tools_len = tools.map_or(0, |t| t.to_string().len());
        let input: usize = messages.iter().map(|m| m.role.len() + m.content.len()).sum::<usize>() + calls + tools_len;
        let mut out = BoundedOutput { text: Vec::new(), limit: input.saturating_mul(4).saturating_add(RENDER_OUTPUT_SLACK) };
        // A render that panicked cannot have left the environment half-changed: only the fuel is
        // set here, and every render sets it.
        let mut env = self.env.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        env.set_fuel(Some(RENDER_FUEL.saturating_add((input as u64).saturating_mul(FUEL_PER_INPUT_BYTE))));
        let tmpl = env.get_template("chat").map_err(template_err)?;
        let ctx = context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        // Without tools the variable stays undefined, as templates test it (`tools is defined`).
        let ctx = match tools {
            Some(tools) => context! { tools => Value::from_serialize(tools), ..ctx },
            None => ctx,
        };
        tmpl.render_captured_to(ctx, &mut out).map_err(template_err)?;
        // minijinja writes whole UTF-8 strings, so the bytes are text; checked, not assumed.
        String::from_utf8(out.text).map_err(|e| TokenizerError::Template(format!("rendered text is not UTF-8: {e}")))
    }
}

/// `tojson` as Hugging Face's templates have it (Python's `json.dumps`): keys in their order,
/// `", "` and `": "` between items (or `indent` spaces per level), no HTML escaping. Models were
/// trained on tools listed this way; minijinja's own filter sorts keys and writes compact,
/// HTML-escaped JSON.
fn python_tojson(value: Value, kwargs: minijinja::value::Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    Ok(Value::from_safe_string(python_json(&json, indent)))
}

/// JSON text as Python's `json.dumps(value, ensure_ascii=False, indent=indent)` writes it: what
/// chat templates show a model (see `python_tojson`).
pub fn python_json(json: &serde_json::Value, indent: Option<usize>) -> String {
    let mut out = Vec::new();
    // Writing a serde_json value to memory cannot fail.
    let _ = match indent {
        Some(n) => {
            let spaces = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(&spaces));
            serde::Serialize::serialize(json, &mut ser)
        }
        None => serde::Serialize::serialize(json, &mut serde_json::Serializer::with_formatter(&mut out, PythonFormatter)),
    };
    String::from_utf8_lossy(&out).into_owned()
}

/// serde_json's compact output with Python's default separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// The rendered prompt, refusing to grow past `limit` bytes.
struct BoundedOutput {
    text: Vec<u8>,
    limit: usize,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len().saturating_add(buf.len()) > self.limit {
            return Err(std::io::Error::other(format!("the rendered prompt would exceed {} bytes", self.limit)));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
