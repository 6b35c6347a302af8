//! Stop strings over streamed text: generated text is released as soon as it cannot be the start
//! of a stop string; a stop string ends the generation and is never released.

#[derive(Debug, Default)]
pub struct StopBuffer {
    stops: Vec<String>,
    /// Text received but not released: a suffix that may still grow into a stop string.
    held: String,
}

/// What a piece of text did.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    /// Text safe to hand to the client now.
    pub text: String,
    /// The stop string found, if one was (`text` ends where it began).
    pub stop: Option<String>,
}

impl StopBuffer {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String]) -> StopBuffer {
        StopBuffer {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds text; releases what can no longer be part of a stop string.
    pub fn push(&mut self, piece: &str) -> Released {
        self.held.push_str(piece);
        // The earliest match; of stops found at one place, the first given.
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, s)) = first_stop {
            let stop = Some(s.clone());
            let text = self.held[..at].to_string();
            self.held.clear();
            return Released { text, stop };
        }
        // Hold the longest suffix that is a proper prefix of some stop string.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let text = self.held[..keep].to_string();
        self.held.drain(..keep);
        Released { text, stop: None }
    }

    /// The end of the generation without a stop string: everything held.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> StopBuffer {
        StopBuffer::new(&s.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn releases_text_that_cannot_start_a_stop() {
        let mut b = stops(&["\n\n", "END"]);
        assert_eq!(b.push("hello").text, "hello");
        let r = b.push(" wor\n");
        assert_eq!((r.text.as_str(), r.stop), (" wor", None));
        let r = b.push("ld");
        assert_eq!((r.text.as_str(), r.stop), ("\nld", None));
        let r = b.push(" EN");
        assert_eq!(r.text, " ");
        let r = b.push("Dless");
        assert_eq!((r.text.as_str(), r.stop.as_deref()), ("", Some("END")));
    }

    #[test]
    fn earliest_stop_wins_and_splits_inside_a_piece() {
        let mut b = stops(&["b", "a"]);
        let r = b.push("xyab");
        assert_eq!((r.text.as_str(), r.stop.as_deref()), ("xy", Some("a")));
        // Two stops found at one place: the first given.
        let mut b = stops(&["ab", "a"]);
        assert_eq!(b.push("xab").stop.as_deref(), Some("ab"));
    }

    #[test]
    fn no_stops_releases_everything_and_multibyte_is_kept_whole() {
        let mut b = stops(&[""]);
        assert_eq!(b.push("héllo").text, "héllo");
        let mut b = stops(&["é!"]);
        let r = b.push("caf\u{e9}");
        assert_eq!(r.text, "caf");
        assert_eq!(b.flush(), "\u{e9}");
    }
}
