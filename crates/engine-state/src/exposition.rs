//! Prometheus' text exposition format, one sample line at a time: what the load scraper
//! (`crate::load`) and the speed learner (`crate::speed`) read from an engine's `/metrics`.

/// One parsed sample: its metric name, its labels in order, its value.
pub type Sample<'a> = (&'a str, Vec<(String, String)>, f64);

/// One sample line: `name{labels} value [timestamp]`. `None` for comments, blank lines, and lines
/// that do not parse (tolerated: a scrape keeps what it can read).
pub fn parse_sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices();
        let mut key = String::new();
        let end;
        // Labels: key="value" pairs, values with \\, \" and \n escapes.
        loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => {
                    end = i + 1;
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.push((std::mem::take(&mut key), value));
                }
                other => key.push(other),
            }
        }
        rest = &after[end..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((name, labels, value))
}
