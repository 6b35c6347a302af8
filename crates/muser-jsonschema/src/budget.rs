//! The work budget shared by every stage of one conversion.

use serde_json::Value;

use crate::{SchemaError, MAX_WORK};

/// Counts work units (see [`MAX_WORK`]) and stops the conversion when they run out.
pub(crate) struct Budget {
    used: u64,
    limit: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            used: 0,
            limit: MAX_WORK,
        }
    }
}

impl Budget {
    /// Spends `n` units on behalf of `keyword` at `ptr`.
    pub fn spend(&mut self, n: u64, keyword: &str, ptr: &str) -> Result<(), SchemaError> {
        self.used = self.used.saturating_add(n);
        if self.used > self.limit {
            return Err(SchemaError::too_complex(
                keyword,
                ptr,
                format!("converting the schema takes more than {} steps", self.limit),
            ));
        }
        Ok(())
    }

    /// Spends `n` units; false when the budget is exhausted (for infallible analyses).
    pub fn try_spend(&mut self, n: u64) -> bool {
        self.used = self.used.saturating_add(n);
        self.used <= self.limit
    }

    pub fn exhausted(&self) -> bool {
        self.used > self.limit
    }
}

/// Size of a JSON value in nodes (what copying it costs).
pub(crate) fn weight(v: &Value) -> u64 {
    match v {
        Value::Array(a) => 1 + a.iter().map(weight).sum::<u64>(),
        Value::Object(m) => 1 + m.values().map(weight).sum::<u64>(),
        _ => 1,
    }
}

/// [`weight`] of a map.
pub(crate) fn map_weight(m: &serde_json::Map<String, Value>) -> u64 {
    1 + m.values().map(weight).sum::<u64>()
}
