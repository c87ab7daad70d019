//! Stop sequences over streamed text: a stop string may span several tokens, so text that could
//! be the start of one is held back until it is known not to be. Nothing of a stop sequence (or
//! after it) is ever sent, as OpenAI does.

pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released.
    held: String,
    /// The index of the stop sequence found, once one is.
    matched: Option<usize>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops,
            held: String::new(),
            matched: None,
        }
    }

    /// Adds `text` and puts in `out` what can no longer be part of a stop sequence. Returns
    /// true when a stop sequence was found: `out` then ends just before it.
    pub fn push(&mut self, text: &str, out: &mut String) -> bool {
        out.clear();
        self.held.push_str(text);
        let first_stop = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|at| (at, i)))
            .min();
        if let Some((at, i)) = first_stop {
            out.push_str(&self.held[..at]);
            self.held.clear();
            self.matched = Some(i);
            return true;
        }
        let keep = self.partial_match_len();
        let release = self.held.len() - keep;
        out.push_str(&self.held[..release]);
        self.held.drain(..release);
        false
    }

    /// The index in the list given to [`StopMatcher::new`] of the stop sequence found (the
    /// first in the text; of two starting at the same place, the first listed).
    pub fn matched(&self) -> Option<usize> {
        self.matched
    }

    /// The held text, released when generation ends for another reason.
    pub fn finish(&mut self, out: &mut String) {
        out.clear();
        out.push_str(&self.held);
        self.held.clear();
    }

    /// The length of the longest suffix of `held` that is a proper prefix of a stop sequence.
    fn partial_match_len(&self) -> usize {
        let held = self.held.as_str();
        self.stops
            .iter()
            .filter_map(|stop| {
                let longest = held.len().min(stop.len() - 1);
                (1..=longest).rev().find(|&n| {
                    let start = held.len() - n;
                    held.is_char_boundary(start)
                        && stop.as_bytes().starts_with(&held.as_bytes()[start..])
                })
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` and returns (everything released, whether a stop was hit).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let (mut all, mut out) = (String::new(), String::new());
        for p in pieces {
            let stopped = m.push(p, &mut out);
            all.push_str(&out);
            if stopped {
                return (all, true);
            }
        }
        m.finish(&mut out);
        all.push_str(&out);
        (all, false)
    }

    #[test]
    fn no_stops_passes_everything() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn stop_inside_one_piece() {
        assert_eq!(run(&["END"], &["abcENDdef"]), ("abc".into(), true));
    }

    #[test]
    fn stop_across_pieces_is_never_partly_sent() {
        let mut m = StopMatcher::new(vec!["\n\nUser:".into()]);
        let mut out = String::new();
        assert!(!m.push("Hello\n", &mut out));
        assert_eq!(out, "Hello");
        assert!(!m.push("\nUs", &mut out));
        assert_eq!(out, "");
        assert!(m.push("er: hi", &mut out));
        assert_eq!(out, "");
    }

    #[test]
    fn false_alarm_is_released() {
        assert_eq!(run(&["ab"], &["xa", "c"]), ("xac".into(), false));
        assert_eq!(run(&["ab"], &["xa"]), ("xa".into(), false));
    }

    #[test]
    fn earliest_of_several_stops() {
        assert_eq!(run(&["cd", "b"], &["abcd"]), ("a".into(), true));
    }

    #[test]
    fn the_stop_found_is_named_by_its_index() {
        let mut m = StopMatcher::new(vec!["cd".into(), "b".into()]);
        let mut out = String::new();
        assert_eq!(m.matched(), None);
        assert!(!m.push("a", &mut out));
        assert_eq!(m.matched(), None);
        assert!(m.push("bcd", &mut out));
        assert_eq!(m.matched(), Some(1));
    }

    #[test]
    fn multibyte_text() {
        assert_eq!(run(&["é!"], &["café", "!x"]), ("caf".into(), true));
        assert_eq!(run(&["éx"], &["café", "?"]), ("café?".into(), false));
    }
}
