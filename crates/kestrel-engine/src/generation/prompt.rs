//! A request's prompt as token ids: raw text, or a conversation rendered with the model's chat
//! template (with the request's tools, when it has some), then encoded.

use kestrel_model::{ChatMessage, Model, ModelError};

use super::options::GenerateOptions;
use super::tools::ToolSyntax;

/// What to generate from.
pub enum Prompt<'a> {
    /// Text fed as-is (special-token text is still parsed as special tokens).
    Text(&'a str),
    /// A conversation rendered with the model's chat template, ending with an assistant turn.
    Chat(&'a [ChatMessage]),
}

/// The conversation as `model`'s template renders it for a request with `options`: with its
/// tools, written for the template's tool-call syntax `syntax` (tools.rs), unless it has none or
/// `tool_choice` is `none`.
pub fn render_chat(model: &Model, syntax: ToolSyntax, messages: &[ChatMessage], options: &GenerateOptions) -> Result<String, ModelError> {
    let Some(tools) = options.tool_use() else { return Ok(model.template().render(messages, true)?) };
    let messages = tools.messages(syntax, messages);
    Ok(model.template().render_with_tools(&messages, Some(&tools.template_value()), true)?)
}

/// Token ids of a prompt. BOS is added when the model asks for it and the text does not already
/// start with it (chat templates often write it themselves).
pub fn encode(model: &Model, syntax: ToolSyntax, prompt: &Prompt<'_>, options: &GenerateOptions) -> Result<Vec<u32>, ModelError> {
    let text = match prompt {
        Prompt::Text(t) => t.to_string(),
        Prompt::Chat(messages) => render_chat(model, syntax, messages, options)?,
    };
    let tokenizer = model.tokenizer();
    let bos = tokenizer.bos_text();
    let add_special = !(tokenizer.add_bos() && !bos.is_empty() && text.starts_with(&bos));
    Ok(tokenizer.encode(&text, add_special)?)
}
