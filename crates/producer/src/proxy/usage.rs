//! The answer's length as its usage says it (`"completion_tokens": N`, in a whole answer or in
//! a stream's last chunk when the client asked for usage): what the placer learns how long a
//! prompt's answers are from (docs/behaviour.md §4, "Time"). Read as the bytes pass, without
//! parsing the answer; a count split between two chunks is found all the same.

const KEY: &[u8] = b"\"completion_tokens\":";

/// Finds the last `"completion_tokens": N` in an answer fed to it chunk by chunk.
#[derive(Debug, Default)]
pub struct UsageScanner {
    /// The end of the last chunk: where a key or its number may continue.
    tail: Vec<u8>,
}

impl UsageScanner {
    /// The count this chunk completes, if any (the last in it).
    pub fn scan(&mut self, chunk: &[u8]) -> Option<u32> {
        let mut joined = std::mem::take(&mut self.tail);
        joined.extend_from_slice(chunk);
        let mut found = None;
        let mut cut = None;
        let mut from = 0;
        while let Some(at) = find(&joined[from..], KEY) {
            let start = from + at + KEY.len();
            let digits_from = start
                + joined[start..]
                    .iter()
                    .take_while(|b| b.is_ascii_whitespace())
                    .count();
            let digits = joined[digits_from..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            let end = digits_from + digits;
            if end == joined.len() {
                // The number may go on in the next chunk: keep the key from here.
                cut = Some(from + at);
                break;
            }
            if digits > 0 {
                found = std::str::from_utf8(&joined[digits_from..end])
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .or(found);
            }
            from = end;
        }
        // Otherwise only what a key may have begun in, after the last one read.
        let cut = cut.unwrap_or_else(|| joined.len().saturating_sub(KEY.len()).max(from));
        self.tail = joined[cut..].to_vec();
        found
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usage_of_a_whole_answer_or_a_streams_last_chunk_is_read() {
        let mut scanner = UsageScanner::default();
        let answer = br#"{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":12,"total_tokens":19,"completion_tokens":7}}"#;
        assert_eq!(scanner.scan(answer), Some(7));
        let mut stream = UsageScanner::default();
        assert_eq!(
            stream.scan(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"),
            None
        );
        assert_eq!(
            stream.scan(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\": 256}}\n\ndata: [DONE]\n\n"),
            Some(256)
        );
    }

    #[test]
    fn a_count_split_anywhere_between_chunks_is_found_once() {
        let answer =
            br#"{"usage":{"prompt_tokens":3,"completion_tokens":1234,"total_tokens":1237}}"#;
        for split in 1..answer.len() {
            let mut scanner = UsageScanner::default();
            let first = scanner.scan(&answer[..split]);
            let second = scanner.scan(&answer[split..]);
            assert_eq!(first.or(second), Some(1234), "split at {split}");
            assert!(first.is_none() || second.is_none(), "split at {split}");
        }
    }

    #[test]
    fn an_answer_without_usage_says_nothing_and_keeps_little() {
        let mut scanner = UsageScanner::default();
        for _ in 0..1_000 {
            assert_eq!(scanner.scan(&[b'x'; 4096]), None);
        }
        assert!(scanner.tail.len() <= KEY.len());
        assert_eq!(scanner.scan(b"\"completion_tokens\":abc"), None);
    }
}
