//! (in progress)

use super::{Format, LazyStart, Parsed, Plan, ToolRequest};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Flavor {
    R1,
    V31,
}

pub(super) const LAZY_START: LazyStart = LazyStart::Word("\u{0}");
pub(super) const MARKUP: &[&str] = &[];

pub(super) fn detect(_template: &str) -> Option<Format> {
    None
}

pub(super) fn plan(_req: &ToolRequest, _flavor: Flavor) -> Result<Option<Plan>, String> {
    Err("not yet".into())
}

pub(super) fn parse(text: &str, _req: Option<&ToolRequest>, _flavor: Flavor) -> Parsed {
    Parsed {
        content: text.to_string(),
        ..Parsed::default()
    }
}

pub(super) fn parse_partial(text: &str, _req: Option<&ToolRequest>, _flavor: Flavor) -> Parsed {
    Parsed {
        content: text.to_string(),
        ..Parsed::default()
    }
}
