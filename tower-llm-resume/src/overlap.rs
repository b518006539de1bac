//! How much of a continuation's head repeats the tail of what was sent.

/// The longest repeat looked for: the last 1 KiB of the text already sent
/// (cut at a character boundary). A continuation that starts further back
/// than that (a long answer started over) is no repeat of this window and
/// is spliced as it is.
pub const OVERLAP_WINDOW: usize = 1024;

/// Finds how much of a continuation's head repeats the tail of what was
/// sent: the longest suffix of the sent text's last [`OVERLAP_WINDOW`]
/// bytes that is a prefix of the new text *and starts at a word
/// boundary* (its first character is not alphanumeric, or the one before
/// it is not). A model that repeats itself restarts a word, a sentence or
/// a line; a suffix that starts inside a word and matches is a
/// coincidence ("Hel" continued with "lo" repeats no "l"), and trimming
/// it would lose text. (In scripts written without spaces, a repeat is
/// trimmed only from a punctuation mark on.)
///
/// The new text is fed piece by piece as the continuation streams, and
/// the repeat is decided as early as it can be: as long as the new text
/// so far occurs inside the window (a longer repeat is still possible) it
/// waits for more; once it does not, the longest repeat found is the
/// answer. That costs one comparison per candidate position per byte,
/// which for ordinary text is a few times the window; the work is capped
/// at `WORK_CAP` × the window, after which it waits for a window's worth
/// of new text (or its end) and decides in one linear pass
/// (Knuth–Morris–Pratt). Time and memory are linear in the window,
/// whatever the upstream sends.
#[derive(Debug)]
pub(crate) struct Overlap {
    /// The sent text's tail (starts at a character boundary).
    window: String,
    /// The character before the window in the sent text, if any.
    before: Option<char>,
    /// The first bytes of the new text (at most the window's length).
    head: Vec<u8>,
    /// Start positions `s` in the window where the new text so far
    /// occurs and does not reach the window's end (a longer repeat may
    /// still come).
    live: Vec<u16>,
    /// The longest repeat confirmed so far.
    best: usize,
    /// Comparisons made; past the cap, decide by one pass.
    work: usize,
    filtering: bool,
}

/// Comparisons allowed per byte of window before the one-pass fallback.
const WORK_CAP: usize = 4;

impl Overlap {
    /// Looks for a repeat of the tail of `sent`.
    pub(crate) fn new(sent: &str) -> Self {
        let mut start = sent.len().saturating_sub(OVERLAP_WINDOW);
        while !sent.is_char_boundary(start) {
            start += 1;
        }
        let (before, window) = sent.split_at(start);
        // At most OVERLAP_WINDOW (1024) positions: they fit a u16.
        let live = (0..window.len())
            .filter_map(|s| u16::try_from(s).ok())
            .collect();
        Overlap {
            window: window.to_owned(),
            before: before.chars().next_back(),
            head: Vec::with_capacity(window.len().min(256)),
            live,
            best: 0,
            work: 0,
            filtering: true,
        }
    }

    /// Feeds the next text of the continuation; the repeat's length in
    /// bytes once it is decided.
    pub(crate) fn feed(&mut self, text: &str) -> Option<usize> {
        let w = self.window.len();
        if w == 0 {
            return Some(0);
        }
        for &b in text.as_bytes() {
            if self.head.len() >= w {
                break;
            }
            let j = self.head.len();
            self.head.push(b);
            if !self.filtering {
                continue;
            }
            self.work += self.live.len();
            let window = self.window.as_bytes();
            let mut completed = false;
            self.live.retain(|&s| {
                let at = usize::from(s) + j;
                if window[at] != b {
                    return false;
                }
                if at + 1 == w {
                    // The new text so far is the window's whole tail.
                    completed = true;
                    return false;
                }
                true
            });
            if completed && self.starts_a_word(j + 1) {
                self.best = j + 1;
            }
            if self.live.is_empty() {
                return Some(self.best);
            }
            if self.work > WORK_CAP * w {
                self.filtering = false;
                self.live = Vec::new();
            }
        }
        (self.head.len() >= w).then(|| self.decide())
    }

    /// The repeat's length in bytes, with the text fed so far (the new
    /// text ended, or something other than text came).
    pub(crate) fn finish(&self) -> usize {
        if self.window.is_empty() {
            return 0;
        }
        self.decide()
    }

    fn decide(&self) -> usize {
        if self.filtering {
            return self.best;
        }
        // Every suffix of the window that is a prefix of the head, longest
        // first: the longest match, then its borders.
        let (mut k, failure) = borders(self.window.as_bytes(), &self.head);
        while k > 0 && !self.starts_a_word(k) {
            k = failure[k - 1];
        }
        k
    }

    /// `true` when the window's last `k` bytes start at a word boundary.
    fn starts_a_word(&self, k: usize) -> bool {
        let start = self.window.len() - k;
        let Some(first) = self.window.get(start..).and_then(|t| t.chars().next()) else {
            return false;
        };
        let prev = self
            .window
            .get(..start)
            .and_then(|t| t.chars().next_back())
            .or(self.before);
        !first.is_alphanumeric() || prev.is_none_or(|c| !c.is_alphanumeric())
    }
}

/// The length of the longest prefix of `pattern` that is a suffix of
/// `text`, in one pass over each (Knuth–Morris–Pratt), and `pattern`'s
/// failure function (`failure[i]`: the longest proper prefix of
/// `pattern[..=i]` that is also its suffix), whose chain from that length
/// lists every shorter such prefix.
fn borders(text: &[u8], pattern: &[u8]) -> (usize, Vec<usize>) {
    let m = pattern.len();
    let mut failure = vec![0usize; m];
    if m == 0 {
        return (0, failure);
    }
    let mut k = 0;
    for i in 1..m {
        while k > 0 && pattern[i] != pattern[k] {
            k = failure[k - 1];
        }
        if pattern[i] == pattern[k] {
            k += 1;
        }
        failure[i] = k;
    }
    let mut q = 0;
    for &c in text {
        if q == m {
            q = failure[q - 1];
        }
        while q > 0 && pattern[q] != c {
            q = failure[q - 1];
        }
        if pattern[q] == c {
            q += 1;
        }
    }
    (q, failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, by brute force.
    fn naive(sent: &str, new: &str) -> usize {
        let mut start = sent.len().saturating_sub(OVERLAP_WINDOW);
        while !sent.is_char_boundary(start) {
            start += 1;
        }
        let window = &sent[start..];
        let word_start = |at: usize| {
            let first = sent[at..].chars().next().expect("a char");
            let prev = sent[..at].chars().next_back();
            !first.is_alphanumeric() || prev.is_none_or(|c| !c.is_alphanumeric())
        };
        (1..=window.len().min(new.len()))
            .rev()
            .find(|&k| {
                let at = sent.len() - k;
                sent.is_char_boundary(at)
                    && sent.as_bytes()[at..] == new.as_bytes()[..k]
                    && word_start(at)
            })
            .unwrap_or(0)
    }

    /// Feeds `new` in pieces of `sizes` (cycled), then finishes.
    fn fed(sent: &str, new: &str, sizes: &[usize]) -> usize {
        let mut o = Overlap::new(sent);
        let mut rest = new;
        let mut i = 0;
        while !rest.is_empty() {
            let mut n = sizes[i % sizes.len()].clamp(1, rest.len());
            while !rest.is_char_boundary(n) {
                n += 1;
            }
            let (piece, tail) = rest.split_at(n);
            rest = tail;
            i += 1;
            if let Some(k) = o.feed(piece) {
                return k;
            }
        }
        o.finish()
    }

    #[test]
    fn finds_the_repeat_however_the_new_text_is_split() {
        let cases = [
            ("The cat sat on the", " the mat.", 4),
            ("The cat sat on the", "on the mat.", 6),
            ("The cat sat on the", "sat on the mat.", 10),
            ("Hello, wor", "world!", 3),
            ("Hel", "lo", 0),
            ("Hello world ", " next", 1),
            ("end.\n", "\n\nNext", 1),
            ("ab ab", "ab abc", 5),
            ("ab ab", "b c", 0),
            ("hello", "", 0),
            ("", "hello", 0),
            ("naïve café", "café au lait", 5),
            ("x.ab", "ab!", 2),
        ];
        for (sent, new, want) in cases {
            assert_eq!(naive(sent, new), want, "{sent:?} {new:?}");
            for sizes in [&[1][..], &[2, 3], &[100]] {
                assert_eq!(fed(sent, new, sizes), want, "{sent:?} {new:?} {sizes:?}");
            }
        }
    }

    #[test]
    fn agrees_with_the_definition_on_generated_texts() {
        // A small alphabet makes long and nested repeats common.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for _ in 0..2_000 {
            let len = (next() % 1_500) as usize;
            let sent: String = (0..len)
                .map(|_| ['a', 'b', 'é', ' '][(next() % 4) as usize])
                .collect();
            // Often a repeat of the tail, then more.
            let cut = sent.len().saturating_sub((next() % 1_300) as usize);
            let cut = (cut..=sent.len())
                .find(|&c| sent.is_char_boundary(c))
                .unwrap_or(0);
            let extra: String = (0..(next() % 40))
                .map(|_| ['a', 'b', 'é', ' '][(next() % 4) as usize])
                .collect();
            let new = format!("{}{extra}", &sent[cut..]);
            let sizes = [1 + (next() % 7) as usize, 1 + (next() % 300) as usize];
            assert_eq!(
                fed(&sent, &new, &sizes),
                naive(&sent, &new),
                "{sent:?} / {new:?}"
            );
        }
    }

    #[test]
    fn a_repetitive_text_costs_linear_work() {
        // "a a a …": half the positions stay candidates byte after byte;
        // the filter gives up at the cap and one pass decides.
        let sent = "a ".repeat(OVERLAP_WINDOW * 2);
        let mut o = Overlap::new(&sent);
        let mut decided = None;
        for _ in 0..OVERLAP_WINDOW / 2 {
            decided = o.feed("a ");
            if decided.is_some() {
                break;
            }
        }
        assert_eq!(decided, Some(OVERLAP_WINDOW));
        assert!(o.work <= (WORK_CAP + 1) * OVERLAP_WINDOW, "{}", o.work);
        assert!(!o.filtering);
        // "aaaa…": no repeat starts a word; decided the same way.
        let mut o = Overlap::new(&"a".repeat(OVERLAP_WINDOW * 2));
        let decided = (0..OVERLAP_WINDOW).find_map(|_| o.feed("a"));
        assert_eq!(decided, Some(0));
        assert!(o.work <= (WORK_CAP + 1) * OVERLAP_WINDOW, "{}", o.work);
    }

    #[test]
    fn an_ordinary_continuation_is_decided_within_a_few_bytes() {
        let sent = "It was a bright cold day in April, and the clocks were striking thir";
        let mut o = Overlap::new(sent);
        // "striking" occurs in the window: a repeat may be coming.
        assert_eq!(o.feed("striking"), None);
        // "striking thir" is the window's tail and occurs nowhere else.
        assert_eq!(o.feed(" thir"), Some("striking thir".len()));
    }
}
