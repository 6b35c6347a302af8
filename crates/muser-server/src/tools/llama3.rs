//! (in progress)

use super::{LazyStart, Parsed, Plan, ToolRequest};

pub(super) const LAZY_START: LazyStart = LazyStart::Word("\u{0}");
pub(super) const MARKUP: &[&str] = &[];

pub(super) fn detect(_template: &str) -> bool {
    false
}

pub(super) fn plan(_req: &ToolRequest) -> Result<Option<Plan>, String> {
    Err("not yet".into())
}

pub(super) fn parse(text: &str, _req: Option<&ToolRequest>) -> Parsed {
    Parsed {
        content: text.to_string(),
        ..Parsed::default()
    }
}

pub(super) fn parse_partial(text: &str, _req: Option<&ToolRequest>) -> Parsed {
    Parsed {
        content: text.to_string(),
        ..Parsed::default()
    }
}
