//! Gzip (RFC 1952) of request bodies: one deflate block (RFC 1951) with the
//! fixed Huffman codes and greedy LZ77 matching over a 32 KiB window. Far from
//! the smallest output, but JSON bodies repeat their keys, so it pays, with no
//! compression crate in the binary.

const WINDOW: usize = 32 * 1024;
const HASH_BITS: u32 = 15;
const MAX_CHAIN: usize = 32;
const MIN_MATCH: usize = 3;
const MAX_MATCH: usize = 258;
const NONE: usize = usize::MAX;

const LENGTH_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LENGTH_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
const DISTANCE_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DISTANCE_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];

/// `data` as a gzip member.
pub fn compress(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() / 2 + 32);
    // Magic, deflate, no flags, no mtime, no extra flags, unknown OS.
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);
    let mut bits = Bits {
        out,
        buffer: 0,
        count: 0,
    };
    bits.put(1, 1); // the last block
    bits.put(1, 2); // fixed Huffman codes
    deflate(data, &mut bits);
    bits.symbol(256); // end of block
    let mut out = bits.finish();
    out.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    // ISIZE is the length modulo 2^32.
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

fn deflate(data: &[u8], bits: &mut Bits) {
    let mut matcher = Matcher {
        data,
        head: vec![NONE; 1 << HASH_BITS],
        previous: vec![NONE; WINDOW],
    };
    let mut position = 0;
    while position < data.len() {
        let (length, distance) = matcher.longest_match(position);
        if length >= MIN_MATCH {
            bits.length(length);
            bits.distance(distance);
            for covered in position..position + length {
                matcher.insert(covered);
            }
            position += length;
        } else {
            bits.symbol(u16::from(data[position]));
            matcher.insert(position);
            position += 1;
        }
    }
}

/// Earlier positions by the hash of their first three bytes, newest first.
struct Matcher<'a> {
    data: &'a [u8],
    head: Vec<usize>,
    /// Per window slot, the previous position with the same hash.
    previous: Vec<usize>,
}

impl Matcher<'_> {
    fn insert(&mut self, position: usize) {
        if position + MIN_MATCH <= self.data.len() {
            let hash = hash(&self.data[position..position + MIN_MATCH]);
            self.previous[position % WINDOW] = self.head[hash];
            self.head[hash] = position;
        }
    }

    /// The longest earlier occurrence of the bytes at `position` within the
    /// window: (length, distance), length 0 when there is none.
    fn longest_match(&self, position: usize) -> (usize, usize) {
        let data = self.data;
        if position + MIN_MATCH > data.len() {
            return (0, 0);
        }
        let longest = (data.len() - position).min(MAX_MATCH);
        let mut best = (0, 0);
        let mut candidate = self.head[hash(&data[position..position + MIN_MATCH])];
        for _ in 0..MAX_CHAIN {
            if candidate == NONE || position - candidate > WINDOW {
                break;
            }
            let length = data[candidate..]
                .iter()
                .zip(&data[position..position + longest])
                .take_while(|(earlier, here)| earlier == here)
                .count();
            if length > best.0 {
                best = (length, position - candidate);
                if length == longest {
                    break;
                }
            }
            let next = self.previous[candidate % WINDOW];
            // A slot reused by a newer position ends the chain.
            if next == NONE || next >= candidate {
                break;
            }
            candidate = next;
        }
        best
    }
}

fn hash(bytes: &[u8]) -> usize {
    let value = u32::from(bytes[0]) << 16 | u32::from(bytes[1]) << 8 | u32::from(bytes[2]);
    (value.wrapping_mul(2_654_435_761) >> (32 - HASH_BITS)) as usize
}

/// Writes bits least significant first, as deflate packs them.
struct Bits {
    out: Vec<u8>,
    buffer: u64,
    count: u32,
}

impl Bits {
    fn put(&mut self, value: u32, count: u32) {
        self.buffer |= u64::from(value) << self.count;
        self.count += count;
        while self.count >= 8 {
            self.out.push(self.buffer as u8);
            self.buffer >>= 8;
            self.count -= 8;
        }
    }

    /// A Huffman code goes most significant bit first.
    fn code(&mut self, code: u32, length: u32) {
        self.put(code.reverse_bits() >> (32 - length), length);
    }

    /// A literal byte, the end of block, or a length code (the fixed table).
    fn symbol(&mut self, symbol: u16) {
        let symbol = u32::from(symbol);
        match symbol {
            0..=143 => self.code(0x30 + symbol, 8),
            144..=255 => self.code(0x190 + symbol - 144, 9),
            256..=279 => self.code(symbol - 256, 7),
            _ => self.code(0xc0 + symbol - 280, 8),
        }
    }

    fn length(&mut self, length: usize) {
        let index = LENGTH_BASE.partition_point(|&base| usize::from(base) <= length) - 1;
        self.symbol(257 + index as u16);
        self.put(
            (length - usize::from(LENGTH_BASE[index])) as u32,
            u32::from(LENGTH_EXTRA[index]),
        );
    }

    fn distance(&mut self, distance: usize) {
        let index = DISTANCE_BASE.partition_point(|&base| usize::from(base) <= distance) - 1;
        self.code(index as u32, 5);
        self.put(
            (distance - usize::from(DISTANCE_BASE[index])) as u32,
            u32::from(DISTANCE_EXTRA[index]),
        );
    }

    fn finish(mut self) -> Vec<u8> {
        if self.count > 0 {
            self.out.push(self.buffer as u8);
        }
        self.out
    }
}

/// The system's gzip, to decode what `compress` wrote.
#[cfg(test)]
#[path = "../../../tests/support/gunzip.rs"]
mod system_gzip;

#[cfg(test)]
mod tests {
    use super::*;

    use super::system_gzip::gunzip;

    fn json_lines(count: usize) -> Vec<u8> {
        (0..count)
            .map(|n| format!("{{\"metadata\":{{\"iggy_offset\":{n},\"iggy_topic\":\"events\"}},\"payload\":{{\"n\":{n}}}}}\n"))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn given_assorted_bodies_when_compressed_should_be_decoded_by_gzip() {
        let mut noise = vec![0u8; 100_000];
        rand::fill(&mut noise[..]);
        let cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"a".to_vec(),
            b"abcabcabcabcabc".to_vec(),
            vec![b'x'; 70_000],
            (0..=255u8).cycle().take(5000).collect(),
            noise,
            json_lines(5000),
        ];
        for case in cases {
            assert_eq!(gunzip(&compress(&case)), case, "{} bytes", case.len());
        }
    }

    #[test]
    fn given_repetitive_json_when_compressed_should_shrink() {
        let body = json_lines(1000);
        let compressed = compress(&body);
        assert!(
            compressed.len() * 4 < body.len(),
            "{} -> {} bytes",
            body.len(),
            compressed.len()
        );
    }
}
