//! One request body from many encoded items, closed when the next item would
//! pass a count or a byte limit: an ndjson body, a JSON array, a bulk request.

/// How items are joined into one body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// Before the first item (`[` for a JSON array).
    pub open: &'static [u8],
    /// Between two items (`,` for a JSON array).
    pub separator: &'static [u8],
    /// After every item (`\n` for ndjson).
    pub terminator: &'static [u8],
    /// After the last item (`]` for a JSON array).
    pub close: &'static [u8],
}

impl Framing {
    /// One JSON document per line.
    pub const NDJSON: Framing = Framing {
        open: b"",
        separator: b"",
        terminator: b"\n",
        close: b"",
    };

    /// `[item,item,...]`.
    pub const JSON_ARRAY: Framing = Framing {
        open: b"[",
        separator: b",",
        terminator: b"",
        close: b"]",
    };

    /// The size of a body holding only an item of `item_len` bytes.
    pub fn alone(&self, item_len: usize) -> usize {
        self.open.len() + item_len + self.terminator.len() + self.close.len()
    }
}

/// When a body is full. `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub max_items: Option<usize>,
    pub max_bytes: Option<usize>,
}

/// What [`Body::push`] did with an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    Added,
    /// The body is full: send it, then push the item into a new one.
    Full,
    /// The item alone makes a body of `size` bytes, over the byte limit.
    TooLarge {
        size: usize,
    },
}

/// A body being filled.
#[derive(Debug)]
pub struct Body {
    framing: Framing,
    limits: Limits,
    bytes: Vec<u8>,
    items: usize,
}

impl Body {
    pub fn new(framing: Framing, limits: Limits) -> Self {
        Self {
            framing,
            limits,
            bytes: Vec::new(),
            items: 0,
        }
    }

    /// Appends `item` if the body stays within the limits.
    pub fn push(&mut self, item: &[u8]) -> Push {
        let max_bytes = self.limits.max_bytes.unwrap_or(usize::MAX);
        if self.items == 0 {
            let size = self.framing.alone(item.len());
            if size > max_bytes {
                return Push::TooLarge { size };
            }
            self.bytes.extend_from_slice(self.framing.open);
        } else {
            let grown = self.bytes.len()
                + self.framing.separator.len()
                + item.len()
                + self.framing.terminator.len()
                + self.framing.close.len();
            let full_by_count = self
                .limits
                .max_items
                .is_some_and(|max_items| self.items >= max_items);
            if full_by_count || grown > max_bytes {
                return Push::Full;
            }
            self.bytes.extend_from_slice(self.framing.separator);
        }
        self.bytes.extend_from_slice(item);
        self.bytes.extend_from_slice(self.framing.terminator);
        self.items += 1;
        Push::Added
    }

    pub fn items(&self) -> usize {
        self.items
    }

    pub fn is_empty(&self) -> bool {
        self.items == 0
    }

    /// The finished body.
    pub fn finish(mut self) -> Vec<u8> {
        self.bytes.extend_from_slice(self.framing.close);
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes every item, starting a new body whenever one is full.
    fn split(framing: Framing, limits: Limits, items: &[&str]) -> Vec<String> {
        let mut bodies = Vec::new();
        let mut body = Body::new(framing, limits);
        for item in items {
            loop {
                match body.push(item.as_bytes()) {
                    Push::Added => break,
                    Push::Full => {
                        bodies.push(std::mem::replace(&mut body, Body::new(framing, limits)))
                    }
                    Push::TooLarge { size } => {
                        let mut marker = Body::new(Framing::NDJSON, Limits::default());
                        marker.push(format!("too large: {size}").as_bytes());
                        bodies.push(marker);
                        break;
                    }
                }
            }
        }
        if !body.is_empty() {
            bodies.push(body);
        }
        bodies
            .into_iter()
            .map(|body| String::from_utf8(body.finish()).unwrap())
            .collect()
    }

    #[test]
    fn given_a_count_limit_when_filled_should_close_each_body_at_that_count() {
        let limits = Limits {
            max_items: Some(2),
            max_bytes: None,
        };
        assert_eq!(
            split(Framing::JSON_ARRAY, limits, &["1", "2", "3", "4", "5"]),
            vec!["[1,2]", "[3,4]", "[5]"]
        );
    }

    #[test]
    fn given_a_byte_limit_when_filled_should_keep_every_body_within_it() {
        // "[11,22]" is 7 bytes; a third item would make "[11,22,33]" (10),
        // "[33,44,5]" would be 9.
        let limits = Limits {
            max_items: None,
            max_bytes: Some(8),
        };
        let bodies = split(Framing::JSON_ARRAY, limits, &["11", "22", "33", "44", "5"]);
        assert_eq!(bodies, vec!["[11,22]", "[33,44]", "[5]"]);
        let exact = Limits {
            max_items: None,
            max_bytes: Some(7),
        };
        assert_eq!(
            split(Framing::JSON_ARRAY, exact, &["11", "22"]),
            vec!["[11,22]"],
            "a body of exactly the limit fits"
        );
    }

    #[test]
    fn given_a_byte_limit_when_filled_as_ndjson_should_count_the_line_breaks() {
        let limits = Limits {
            max_items: None,
            max_bytes: Some(6),
        };
        assert_eq!(
            split(Framing::NDJSON, limits, &["aa", "bb", "cc"]),
            vec!["aa\nbb\n", "cc\n"]
        );
    }

    #[test]
    fn given_an_item_over_the_limit_alone_when_pushed_should_say_how_large() {
        let limits = Limits {
            max_items: None,
            max_bytes: Some(4),
        };
        assert_eq!(
            split(Framing::JSON_ARRAY, limits, &["1", "12345", "2"]),
            vec!["[1]", "too large: 7\n", "[2]"]
        );
    }
}
