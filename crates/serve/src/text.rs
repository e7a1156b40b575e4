//! Incremental detokenization for streamed answers: token bytes become UTF-8
//! text as they come (a character split across tokens is held back until
//! complete, [`TextStream`]), and stop strings are matched across token
//! boundaries (text that could still be the start of a stop string is held
//! back until it is known not to be one).

use xtc_model::text::bpe::{Bpe, TextStream, TokenKind};

/// What one more token produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Piece {
    /// Text safe to send now (may be empty).
    pub text: String,
    /// The stop string that matched, if one did: the text ends before it
    /// and the request is finished.
    pub stopped: Option<String>,
}

/// Turns generated tokens into text and finds stop strings (see the module
/// doc). Control tokens (`<|im_end|>`, ...) add no text.
#[derive(Debug, Clone, Default)]
pub struct Detokenizer {
    utf8: TextStream,
    stops: Vec<String>,
    /// Complete text not sent yet because it may begin a stop string.
    held: String,
}

impl Detokenizer {
    /// A detokenizer that stops at any of `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Detokenizer {
        Detokenizer {
            utf8: TextStream::new(),
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Feeds token `id`'s bytes; returns the text now safe to send and the
    /// stop string if one completed (the text before it is returned, the
    /// stop string and anything after it are not).
    ///
    /// # Panics
    /// If `id` is outside `tok`'s vocabulary (the engine only sees the
    /// model's own tokens).
    pub fn push(&mut self, tok: &Bpe, id: u32) -> Piece {
        if tok.kind(id) == TokenKind::Control {
            return Piece::default();
        }
        let new = self.utf8.push(tok.token_bytes(id));
        self.push_text(&new)
    }

    /// As [`push`](Self::push), but no stop string is looked for: what is
    /// complete goes out at once, held text included. For the tokens before
    /// `min_tokens`, where (as in vLLM) stop strings do not end an answer.
    ///
    /// # Panics
    /// As [`push`](Self::push).
    pub fn push_unchecked(&mut self, tok: &Bpe, id: u32) -> Piece {
        if tok.kind(id) != TokenKind::Control {
            let new = self.utf8.push(tok.token_bytes(id));
            self.held.push_str(&new);
        }
        Piece {
            text: std::mem::take(&mut self.held),
            stopped: None,
        }
    }

    /// Feeds text (what [`push`](Self::push) does after UTF-8 assembly).
    pub fn push_text(&mut self, new: &str) -> Piece {
        self.held.push_str(new);
        if self.stops.is_empty() {
            return Piece {
                text: std::mem::take(&mut self.held),
                stopped: None,
            };
        }
        // The earliest stop string in the held text wins.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, s)| (*at, std::cmp::Reverse(s.len())));
        if let Some((at, s)) = first {
            let stopped = Some(s.clone());
            let text = self.held[..at].to_string();
            self.held.clear();
            return Piece { text, stopped };
        }
        // Hold back the longest suffix that is a proper prefix of a stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        Piece {
            text,
            stopped: None,
        }
    }

    /// Everything still held (a partial stop-string match, an incomplete
    /// character as U+FFFD): the end of an answer that did not stop on a
    /// stop string.
    pub fn finish(&mut self) -> String {
        let tail = self.utf8.finish();
        self.held.push_str(&tail);
        std::mem::take(&mut self.held)
    }
}

/// Bytes of the longest suffix of `text` that is a proper prefix of `stop`
/// (on character boundaries of `text`).
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = text.len().min(stop.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], parts: &[&str]) -> (String, Option<String>) {
        let mut d = Detokenizer::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in parts {
            let piece = d.push_text(p);
            out += &piece.text;
            if piece.stopped.is_some() {
                return (out, piece.stopped);
            }
        }
        out += &d.finish();
        (out, None)
    }

    #[test]
    fn stop_strings_match_across_pieces() {
        assert_eq!(
            run(&["\n\n"], &["Hello", "\n", "\nWorld"]),
            ("Hello".into(), Some("\n\n".into()))
        );
        assert_eq!(
            run(&["END"], &["abc E", "N", "D tail"]),
            ("abc ".into(), Some("END".into()))
        );
        // A partial match that does not complete is sent in the end.
        assert_eq!(
            run(&["END"], &["abc E", "N", "x"]),
            ("abc ENx".into(), None)
        );
        assert_eq!(run(&["END"], &["abc EN"]), ("abc EN".into(), None));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None));
    }

    #[test]
    fn held_text_is_only_a_possible_stop_prefix() {
        let mut d = Detokenizer::new(vec!["STOP".into()]);
        assert_eq!(d.push_text("xyz S").text, "xyz ");
        assert_eq!(d.push_text("T").text, "");
        assert_eq!(d.push_text("a").text, "STa");
    }

    #[test]
    fn multibyte_suffixes_are_cut_on_char_boundaries() {
        let mut d = Detokenizer::new(vec!["é!".into()]);
        assert_eq!(d.push_text("café").text, "caf");
        let p = d.push_text("!");
        assert_eq!(p.stopped.as_deref(), Some("é!"));
        assert_eq!(p.text, "");
    }
}
