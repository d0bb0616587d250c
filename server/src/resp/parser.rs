//! RESP2 request parsing: arrays of bulk strings (what client libraries,
//! `redis-cli` and most of `redis-benchmark` send) and inline commands (a
//! line of words, as typed into telnet or sent by `redis-benchmark -t
//! ping`), with Redis's error texts.
//!
//! The contract is tokio-util's codec contract, made resumable: `parse`
//! returns `Ok(Some(n))` for a whole command of `n` bytes at the front of
//! the buffer, `Ok(None)` when it needs more bytes (call again with the
//! same buffer, grown; the parser remembers how far it got, so a command
//! that arrives in many reads is scanned once), and `Err` when the stream
//! is corrupt: reply the error and close the connection.
//!
//! Bounds, all checked before waiting for or keeping any byte they would
//! cover: one command (array or inline line) takes at most
//! `command_bytes_max` bytes (the server passes `--frame-bytes-max`); a
//! bulk string whose declared length would cross that is refused on its
//! header; an array declares at most [`ARGS_MAX`] elements; a `*N` or `$N`
//! header line is at most [`HEADER_LINE_BYTES_MAX`] bytes. Nothing is
//! allocated from a declared length: array arguments are ranges into the
//! caller's buffer, and only inline arguments (which may hold escapes) are
//! copied, after their line has arrived whole.

use std::ops::Range;

/// Longest `*N` / `$N` header after its type byte, CRLF included: a sign,
/// 19 digits and CRLF fit with room to spare.
pub const HEADER_LINE_BYTES_MAX: usize = 32;
/// Most elements an array command may declare, and most words on an
/// inline line. Sluice's longest command has 6; Redis tools send few.
pub const ARGS_MAX: usize = 1024;

/// Why a stream is not RESP. The texts are Redis's where Redis has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("Protocol error: invalid multibulk length")]
    MultibulkLength,
    #[error("Protocol error: too big mbulk count string")]
    MultibulkLine,
    #[error("Protocol error: expected '$', got '{}'", char::from(*.0))]
    ExpectedBulk(u8),
    #[error("Protocol error: invalid bulk length")]
    BulkLength,
    #[error("Protocol error: too big bulk count string")]
    BulkLine,
    #[error("Protocol error: expected CRLF after a bulk string")]
    BulkEnd,
    #[error("Protocol error: too big inline request")]
    InlineTooBig,
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    #[error("Protocol error: too many arguments in request")]
    TooManyArgs,
}

/// Where parsing of the command at the front of the buffer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing parsed of the next command.
    Start,
    /// In an array: `left` bulk strings to go, the next one at `pos`.
    Array { left: usize, pos: usize },
    /// In an inline line: no newline in its first `scanned` bytes.
    Inline { scanned: usize },
}

/// A resumable RESP2 request parser; one per connection.
#[derive(Debug)]
pub struct Parser {
    /// Most bytes one command may take.
    command_bytes_max: usize,
    /// Progress through the command at the front of the buffer.
    state: State,
    /// The command's arguments: ranges into the buffer, or into `scratch`
    /// when `inline`.
    args: Vec<Range<usize>>,
    /// Inline arguments with their quotes and escapes resolved.
    scratch: Vec<u8>,
    /// Whether `args` index `scratch` rather than the buffer.
    inline: bool,
}

/// A whole line, or why there is none yet.
enum Line {
    /// The line's content and the offset just past its CRLF.
    Whole(Range<usize>, usize),
    /// Its CRLF has not arrived.
    Partial,
    /// No CRLF within [`HEADER_LINE_BYTES_MAX`].
    TooLong,
    /// A CR not followed by LF.
    Bad,
}

impl Parser {
    /// From the next command on, accepts up to `command_bytes_max` bytes
    /// (raised once a connection has authenticated).
    pub fn set_command_bytes_max(&mut self, command_bytes_max: usize) {
        self.command_bytes_max = command_bytes_max;
    }

    /// A parser accepting commands of up to `command_bytes_max` bytes.
    pub fn new(command_bytes_max: usize) -> Parser {
        Parser {
            command_bytes_max,
            state: State::Start,
            args: Vec::new(),
            scratch: Vec::new(),
            inline: false,
        }
    }

    /// Forgets any progress through a command not yet whole: the next
    /// `parse` starts afresh at the front of the buffer it is given (for a
    /// caller that goes back to an earlier command boundary).
    pub fn restart(&mut self) {
        self.state = State::Start;
    }

    /// Parses the command at the front of `buf` (see the module docs).
    /// After `Ok(Some(_))`, [`Parser::args`] holds its arguments until the
    /// next call; zero arguments is an empty command (`*0`, a blank line)
    /// that Redis skips without a reply.
    pub fn parse(&mut self, buf: &[u8]) -> Result<Option<usize>, ParseError> {
        if self.state == State::Start {
            let Some(&first) = buf.first() else {
                return Ok(None);
            };
            self.args.clear();
            self.scratch.clear();
            self.inline = first != b'*';
            if !self.inline {
                if let Some(n) = self.whole_array(buf) {
                    return Ok(Some(n));
                }
                self.args.clear();
            }
            self.state = if self.inline {
                State::Inline { scanned: 0 }
            } else {
                match self.array_header(buf)? {
                    Some(state) => state,
                    None => return Ok(None),
                }
            };
        }
        let parsed = match self.state {
            State::Start => unreachable!("set above"),
            State::Array { left, pos } => self.array_items(buf, left, pos)?,
            State::Inline { scanned } => self.inline_line(buf, scanned)?,
        };
        if parsed.is_some() {
            self.state = State::Start;
        }
        Ok(parsed)
    }

    /// The arguments of the command `parse` last returned, over the same
    /// buffer.
    pub fn args<'a>(&'a self, buf: &'a [u8]) -> Args<'a> {
        let data = if self.inline { &self.scratch[..] } else { buf };
        Args {
            ranges: &self.args,
            data,
        }
    }

    /// The usual command in one pass: an array of at most 9 bulk strings
    /// of at most 99 bytes each, written the canonical way, whole in `buf`
    /// and within `command_bytes_max` (a CL.THROTTLE from any client
    /// library). `None` for anything else (partial, longer, malformed,
    /// too big), which the resumable path then parses from the start with
    /// its own checks and errors: this changes no result, only how fast
    /// the common one is found (the two-step path, a line scan and then a
    /// length parse per header, was a third of a CL.THROTTLE's
    /// instructions).
    #[inline]
    fn whole_array(&mut self, buf: &[u8]) -> Option<usize> {
        let &[b'*', n @ b'1'..=b'9', b'\r', b'\n', ..] = buf else {
            return None;
        };
        let mut pos = 4;
        for _ in 0..n - b'0' {
            // Every bulk string takes at least 6 bytes (`$0\r\n\r\n`).
            let (len, start) = match *buf.get(pos..pos + 5)? {
                [b'$', d @ b'0'..=b'9', b'\r', b'\n', _] => (usize::from(d - b'0'), pos + 4),
                [b'$', tens @ b'1'..=b'9', ones @ b'0'..=b'9', b'\r', b'\n'] => (
                    usize::from(tens - b'0') * 10 + usize::from(ones - b'0'),
                    pos + 5,
                ),
                _ => return None,
            };
            let end = start + len + 2;
            if end > self.command_bytes_max || buf.get(end - 2..end)? != b"\r\n" {
                return None;
            }
            self.args.push(start..start + len);
            pos = end;
        }
        Some(pos)
    }

    /// `*N\r\n`: the state to go on in, or `None` until the line is whole.
    fn array_header(&mut self, buf: &[u8]) -> Result<Option<State>, ParseError> {
        let (content, next) = match line(buf, 1) {
            Line::Whole(content, next) => (content, next),
            Line::Partial => return Ok(None),
            Line::TooLong => return Err(ParseError::MultibulkLine),
            Line::Bad => return Err(ParseError::MultibulkLength),
        };
        let count = parse_len(&buf[content]).ok_or(ParseError::MultibulkLength)?;
        // Redis ignores `*0` and `*-1` requests: no arguments, no reply.
        let left = usize::try_from(count.max(0))
            .ok()
            .filter(|&n| n <= ARGS_MAX)
            .ok_or(ParseError::MultibulkLength)?;
        Ok(Some(State::Array { left, pos: next }))
    }

    /// The array's remaining bulk strings, each `$LEN\r\nDATA\r\n`.
    fn array_items(
        &mut self,
        buf: &[u8],
        mut left: usize,
        mut pos: usize,
    ) -> Result<Option<usize>, ParseError> {
        while left > 0 {
            self.state = State::Array { left, pos };
            let Some(&kind) = buf.get(pos) else {
                return Ok(None);
            };
            if kind != b'$' {
                return Err(ParseError::ExpectedBulk(kind));
            }
            let (content, start) = match line(buf, pos + 1) {
                Line::Whole(content, next) => (content, next),
                Line::Partial => return Ok(None),
                Line::TooLong => return Err(ParseError::BulkLine),
                Line::Bad => return Err(ParseError::BulkLength),
            };
            let len = parse_len(&buf[content])
                .and_then(|n| usize::try_from(n).ok())
                .ok_or(ParseError::BulkLength)?;
            // The whole command, this string and its CRLF, within bounds:
            // checked on the header, before waiting for the data.
            let end = start
                .checked_add(len)
                .and_then(|n| n.checked_add(2))
                .filter(|&end| end <= self.command_bytes_max)
                .ok_or(ParseError::BulkLength)?;
            if buf.len() < end {
                return Ok(None);
            }
            if &buf[end - 2..end] != b"\r\n" {
                return Err(ParseError::BulkEnd);
            }
            self.args.push(start..start + len);
            pos = end;
            left -= 1;
        }
        Ok(Some(pos))
    }

    /// An inline command: one line, LF or CRLF terminated.
    fn inline_line(&mut self, buf: &[u8], scanned: usize) -> Result<Option<usize>, ParseError> {
        let window = buf.len().min(self.command_bytes_max);
        let Some(i) = buf[scanned.min(window)..window]
            .iter()
            .position(|&b| b == b'\n')
        else {
            if buf.len() >= self.command_bytes_max {
                return Err(ParseError::InlineTooBig);
            }
            self.state = State::Inline { scanned: buf.len() };
            return Ok(None);
        };
        let newline = scanned.min(window) + i;
        let line = &buf[..newline];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        self.split_inline(line)?;
        Ok(Some(newline + 1))
    }

    /// Splits an inline line into words as Redis's `sdssplitargs` does:
    /// blanks separate words; "double quotes" take `\n \r \t \b \a \\ \"`
    /// and `\xHH` escapes; 'single quotes' take `\'`; a closing quote must
    /// be followed by a blank or the end of the line.
    fn split_inline(&mut self, line: &[u8]) -> Result<(), ParseError> {
        let mut i = 0;
        loop {
            while line.get(i).is_some_and(|&b| is_blank(b)) {
                i += 1;
            }
            if i == line.len() {
                return Ok(());
            }
            if self.args.len() == ARGS_MAX {
                return Err(ParseError::TooManyArgs);
            }
            let start = self.scratch.len();
            i = self.word(line, i)?;
            self.args.push(start..self.scratch.len());
        }
    }

    /// Copies one word starting at `i` into `scratch`; returns where the
    /// next word may start.
    fn word(&mut self, line: &[u8], mut i: usize) -> Result<usize, ParseError> {
        let closes = |at: usize| !matches!(line.get(at), Some(&b) if !is_blank(b));
        let mut quote = None;
        loop {
            let b = line.get(i).copied();
            match (quote, b) {
                (Some(_), None) => return Err(ParseError::UnbalancedQuotes),
                (Some(b'"'), Some(b'\\')) if i + 1 < line.len() => {
                    let hex = line.get(i + 2..i + 4).and_then(hex_byte);
                    if let (b'x', Some(byte)) = (line[i + 1], hex) {
                        self.scratch.push(byte);
                        i += 3;
                    } else {
                        i += 1;
                        self.scratch.push(unescape(line[i]));
                    }
                }
                (Some(b'\''), Some(b'\\')) if line.get(i + 1) == Some(&b'\'') => {
                    i += 1;
                    self.scratch.push(b'\'');
                }
                (Some(q), Some(c)) if c == q => {
                    if !closes(i + 1) {
                        return Err(ParseError::UnbalancedQuotes);
                    }
                    return Ok(i + 1);
                }
                (Some(_), Some(c)) => self.scratch.push(c),
                (None, None | Some(b' ' | b'\n' | b'\r' | b'\t')) => return Ok(i),
                (None, Some(c @ (b'"' | b'\''))) => quote = Some(c),
                (None, Some(c)) => self.scratch.push(c),
            }
            i += 1;
        }
    }
}

/// The arguments of one command, command name first.
#[derive(Clone, Copy, Debug)]
pub struct Args<'a> {
    /// Each argument's bytes in `data`.
    ranges: &'a [Range<usize>],
    /// The buffer (or inline scratch) they index.
    data: &'a [u8],
}

impl<'a> Args<'a> {
    /// How many arguments, the command name included.
    #[inline]
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether the command is empty.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Argument `i` (0 is the command name).
    #[inline]
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        self.ranges.get(i).map(|r| &self.data[r.clone()])
    }

    /// Every argument, in order.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let data = self.data;
        self.ranges.iter().map(move |r| &data[r.clone()])
    }
}

/// The line starting at `from`, ended by CRLF within
/// [`HEADER_LINE_BYTES_MAX`] bytes (so its CR is in the first MAX - 1).
fn line(buf: &[u8], from: usize) -> Line {
    let end = buf.len().min(from + HEADER_LINE_BYTES_MAX - 1);
    let window = buf.get(from..end).unwrap_or_default();
    match window.iter().position(|&b| b == b'\r') {
        Some(i) => match buf.get(from + i + 1) {
            Some(b'\n') => Line::Whole(from..from + i, from + i + 2),
            Some(_) => Line::Bad,
            None => Line::Partial,
        },
        None if window.len() >= HEADER_LINE_BYTES_MAX - 1 => Line::TooLong,
        None => Line::Partial,
    }
}

/// A length as Redis writes it: an optional `-`, then digits without
/// leading zeros, fitting an `i64`.
#[inline]
fn parse_len(s: &[u8]) -> Option<i64> {
    // Digits straight into an i64 (every request has a length per
    // argument: `str::parse` after a UTF-8 check cost about 110
    // instructions each). Accumulated negative, since i64::MIN has no
    // positive counterpart.
    let (negative, digits) = match s.strip_prefix(b"-") {
        Some(digits) => (true, digits),
        None => (false, s),
    };
    match digits {
        [b'0'] if !negative => return Some(0),
        [b'1'..=b'9', ..] => {}
        _ => return None,
    }
    let mut v: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_sub(i64::from(b - b'0'))?;
    }
    if negative {
        Some(v)
    } else {
        v.checked_neg()
    }
}

/// C's `isspace`, which `sdssplitargs` skips between words.
fn is_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn unescape(b: u8) -> u8 {
    match b {
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'b' => 0x08,
        b'a' => 0x07,
        other => other,
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |b: u8| char::from(b).to_digit(16);
    match two {
        [hi, lo] => Some((digit(*hi)? * 16 + digit(*lo)?) as u8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Lengths parse as before: canonical decimal (no sign but `-`, no
        /// leading zero, no `-0`) that fits an i64, like `str::parse` after
        /// those checks.
        #[test]
        fn parse_len_is_the_canonical_i64(s in "-?[0-9+ a]{0,21}", n in proptest::num::i64::ANY) {
            let before = |s: &[u8]| -> Option<i64> {
                let digits = s.strip_prefix(b"-").unwrap_or(s);
                let canonical = match digits {
                    [b'0'] => digits.len() == s.len(),
                    [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
                    _ => false,
                };
                if !canonical {
                    return None;
                }
                std::str::from_utf8(s).ok()?.parse().ok()
            };
            proptest::prop_assert_eq!(parse_len(s.as_bytes()), before(s.as_bytes()));
            let n = n.to_string();
            proptest::prop_assert_eq!(parse_len(n.as_bytes()), before(n.as_bytes()));
        }
    }

    #[test]
    fn parse_len_at_the_edges() {
        assert_eq!(parse_len(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_len(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_len(b"9223372036854775808"), None);
        assert_eq!(parse_len(b"-9223372036854775809"), None);
        for bad in [&b""[..], b"-", b"-0", b"01", b"+1", b"1 ", b" 1"] {
            assert_eq!(parse_len(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    const MAX: usize = 1 << 10;

    /// Parses every command in `input`, given whole.
    fn all(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ParseError> {
        let mut p = Parser::new(MAX);
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(n) = p.parse(&input[at..])? {
            out.push(p.args(&input[at..]).iter().map(<[u8]>::to_vec).collect());
            at += n;
        }
        assert_eq!(at, input.len(), "trailing bytes in a test input");
        Ok(out)
    }

    /// Parses `input` fed one byte at a time, as a slow client would send it.
    fn trickled(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ParseError> {
        let (out, error, left) = feed(input, MAX, 1);
        if let Some(e) = error {
            return Err(e);
        }
        assert_eq!(left, 0, "a partial command left over");
        Ok(out)
    }

    /// Commands, the first error and the bytes of a partial command left
    /// at the end, `input` fed `step` bytes at a time to a parser taking
    /// commands of up to `max` bytes.
    fn feed(
        input: &[u8],
        max: usize,
        step: usize,
    ) -> (Vec<Vec<Vec<u8>>>, Option<ParseError>, usize) {
        let mut p = Parser::new(max);
        let mut out = Vec::new();
        let mut buf = Vec::new();
        for chunk in input.chunks(step) {
            buf.extend_from_slice(chunk);
            loop {
                match p.parse(&buf) {
                    Ok(Some(n)) => {
                        out.push(p.args(&buf).iter().map(<[u8]>::to_vec).collect());
                        buf.drain(..n);
                    }
                    Ok(None) => break,
                    Err(e) => return (out, Some(e), buf.len()),
                }
            }
        }
        (out, None, buf.len())
    }

    /// Commands and the first error, as [`feed`] finds them.
    type Outcome = (Vec<Vec<Vec<u8>>>, Option<ParseError>);
    fn fed(input: &[u8], max: usize, step: usize) -> Outcome {
        let (out, error, _) = feed(input, max, step);
        (out, error)
    }

    /// Arrays of bulk strings as clients write them, then (maybe) one
    /// byte replaced by a byte that matters to the grammar, or the end
    /// cut off.
    fn resp_inputs() -> impl Strategy<Value = Vec<u8>> {
        let arg =
            proptest::collection::vec(proptest::sample::select(b"ab$*\r\n09".to_vec()), 0..120);
        let command = proptest::collection::vec(arg, 0..12);
        let mutation = (
            proptest::option::of((
                any::<proptest::sample::Index>(),
                proptest::sample::select(b"$*\r\n0159a-".to_vec()),
            )),
            proptest::option::of(any::<proptest::sample::Index>()),
        );
        (proptest::collection::vec(command, 1..4), mutation).prop_map(|(commands, (swap, cut))| {
            let mut out = Vec::new();
            for c in commands {
                out.extend_from_slice(format!("*{}\r\n", c.len()).as_bytes());
                for a in c {
                    out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                    out.extend_from_slice(&a);
                    out.extend_from_slice(b"\r\n");
                }
            }
            if let Some((i, b)) = swap {
                let i = i.index(out.len());
                out[i] = b;
            }
            if let Some(i) = cut {
                out.truncate(i.index(out.len() + 1));
            }
            out
        })
    }

    use proptest::prelude::{any, Strategy};

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// The one-pass path for whole arrays changes nothing: input given
        /// whole (the one-pass path wherever it applies) parses to the same
        /// commands and the same error as the same input trickled in a
        /// byte at a time (only ever the resumable path), at command size
        /// limits that cut through the arrays.
        #[test]
        fn whole_arrays_parse_as_the_resumable_path_does(
            input in resp_inputs(),
            max in proptest::sample::select(vec![8usize, 30, 64, 200, MAX]),
        ) {
            proptest::prop_assert_eq!(fed(&input, max, input.len().max(1)), fed(&input, max, 1));
        }
    }

    /// Lengths with a leading zero or a sign are refused given whole too,
    /// where the one-pass path looks at them first.
    #[test]
    fn non_canonical_lengths_are_refused_whole_as_trickled() {
        for input in [
            &b"*1\r\n$05\r\nhello\r\n"[..],
            b"*1\r\n$-1\r\n",
            b"*01\r\n$1\r\na\r\n",
            b"*1\r\n$+1\r\na\r\n",
            b"*2\r\n$1\r\na\r\n$00\r\n\r\n",
        ] {
            let whole = fed(input, MAX, input.len());
            assert!(whole.1.is_some(), "{whole:?}");
            assert_eq!(whole, fed(input, MAX, 1));
        }
    }

    /// A parser that stopped part way through a command and is sent back
    /// to an earlier boundary parses from there as from nothing.
    #[test]
    fn restart_forgets_a_partial_command() {
        let stream = b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n*3\r\n$3\r\nSET\r\n$1\r\nk";
        let mut p = Parser::new(MAX);
        let first = p
            .parse(stream)
            .unwrap()
            .expect("the first command is whole");
        assert_eq!(p.parse(&stream[first..]), Ok(None), "the second is not");
        p.restart();
        assert_eq!(p.parse(stream), Ok(Some(first)));
        let args: Vec<&[u8]> = p.args(stream).iter().collect();
        assert_eq!(args, [&b"ECHO"[..], b"hi"]);
    }

    fn words(ws: &[&str]) -> Vec<Vec<u8>> {
        ws.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    fn one_error(input: &[u8]) -> ParseError {
        Parser::new(MAX).parse(input).unwrap_err()
    }

    #[test]
    fn arrays_and_inline_commands() {
        let input =
            b"*5\r\n$11\r\nCL.THROTTLE\r\n$7\r\nuser123\r\n$2\r\n15\r\n$2\r\n30\r\n$2\r\n60\r\n\
                      PING\r\nping hello\n*2\r\n$4\r\nECHO\r\n$4\r\na\r\nb\r\n";
        let expected = vec![
            words(&["CL.THROTTLE", "user123", "15", "30", "60"]),
            words(&["PING"]),
            words(&["ping", "hello"]),
            words(&["ECHO", "a\r\nb"]),
        ];
        assert_eq!(all(input).unwrap(), expected);
        assert_eq!(trickled(input).unwrap(), expected);
    }

    #[test]
    fn every_prefix_is_incomplete_until_the_end() {
        for input in [
            &b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"[..],
            b"PING\r\n",
            b"ECHO \"a b\"\n",
        ] {
            for cut in 0..input.len() {
                let mut p = Parser::new(MAX);
                assert_eq!(p.parse(&input[..cut]), Ok(None), "{input:?} cut at {cut}");
                // The same parser, resumed with the rest, finishes it.
                assert_eq!(
                    p.parse(input),
                    Ok(Some(input.len())),
                    "{input:?} resumed at {cut}"
                );
            }
        }
    }

    #[test]
    fn empty_commands_are_skipped() {
        let cmds = all(b"*0\r\n*-1\r\n\r\n   \r\n\n").unwrap();
        assert!(cmds.iter().all(Vec::is_empty), "{cmds:?}");
        assert_eq!(cmds.len(), 5);
        assert_eq!(trickled(b"*0\r\n\n").unwrap().len(), 2);
    }

    #[test]
    fn inline_quotes_and_escapes() {
        let cmds = all(b"set \"a b\" 'c d' \"\\x41\\n\\\"\" 'it\\'s' e\"f g\" h\r\n").unwrap();
        assert_eq!(
            cmds[0],
            words(&["set", "a b", "c d", "A\n\"", "it's", "ef g", "h"])
        );
        assert_eq!(all(b"  a\t\tb  \n").unwrap()[0], words(&["a", "b"]));
        assert_eq!(all(b"\"\" x\n").unwrap()[0], words(&["", "x"]));
        // An escape that is not one keeps its character; \x needs two hex digits.
        assert_eq!(all(b"\"\\q\\xZZ\"\n").unwrap()[0], words(&["qxZZ"]));
        for bad in [
            &b"\"abc\n"[..],
            b"'abc\n",
            b"\"a\"b\n",
            b"'a'b\n",
            b"\"a\\\"\n",
        ] {
            assert_eq!(one_error(bad), ParseError::UnbalancedQuotes, "{bad:?}");
        }
    }

    #[test]
    fn malformed_arrays() {
        let cases: &[(&[u8], ParseError)] = &[
            (b"*x\r\n", ParseError::MultibulkLength),
            (b"*\r\n", ParseError::MultibulkLength),
            (b"*01\r\n", ParseError::MultibulkLength),
            (b"*+1\r\n", ParseError::MultibulkLength),
            (b"*1 \r\n", ParseError::MultibulkLength),
            (b"*1\rx", ParseError::MultibulkLength),
            (b"*1025\r\n", ParseError::MultibulkLength),
            (b"*99999999999999999999\r\n", ParseError::MultibulkLength),
            (
                b"*1111111111111111111111111111111111111",
                ParseError::MultibulkLine,
            ),
            (b"*1\r\n:1\r\n", ParseError::ExpectedBulk(b':')),
            (b"*2\r\n$1\r\na\r\n*1\r\n", ParseError::ExpectedBulk(b'*')),
            (b"*1\r\n$x\r\n", ParseError::BulkLength),
            (b"*1\r\n$-1\r\n", ParseError::BulkLength),
            (b"*1\r\n$\r\n", ParseError::BulkLength),
            (b"*1\r\n$1\rx", ParseError::BulkLength),
            (b"*1\r\n$00\r\n", ParseError::BulkLength),
            (b"*1\r\n$99999999999999999999\r\n", ParseError::BulkLength),
            (
                b"*1\r\n$1111111111111111111111111111111111111",
                ParseError::BulkLine,
            ),
            (b"*1\r\n$4\r\nPINGxx", ParseError::BulkEnd),
            (b"*1\r\n$4\r\nPING\n\r", ParseError::BulkEnd),
        ];
        for (input, expected) in cases {
            assert_eq!(
                one_error(input),
                *expected,
                "{:?}",
                String::from_utf8_lossy(input)
            );
            assert_eq!(trickled(input), Err(*expected), "trickled {input:?}");
        }
    }

    #[test]
    fn bounds_are_checked_before_the_bytes_arrive() {
        // A declared bulk length past the command bound is refused on its
        // header alone: no waiting for (or keeping) a gigabyte.
        let mut p = Parser::new(MAX);
        assert_eq!(
            p.parse(b"*1\r\n$1073741824\r\n"),
            Err(ParseError::BulkLength)
        );
        assert_eq!(
            Parser::new(MAX).parse(b"*1\r\n$9223372036854775807\r\n"),
            Err(ParseError::BulkLength)
        );
        // Exactly at the bound is fine; one byte more is not.
        let header = format!("*1\r\n${}\r\n", MAX - 13);
        let fits = [header.as_bytes(), &vec![b'a'; MAX - 13][..], b"\r\n"].concat();
        assert_eq!(fits.len(), MAX);
        assert_eq!(Parser::new(MAX).parse(&fits), Ok(Some(MAX)));
        let header = format!("*1\r\n${}\r\n", MAX - 12);
        assert_eq!(
            Parser::new(MAX).parse(header.as_bytes()),
            Err(ParseError::BulkLength)
        );
        // Inline: a line without a newline within the bound.
        let long = vec![b'a'; MAX];
        assert_eq!(Parser::new(MAX).parse(&long), Err(ParseError::InlineTooBig));
        assert_eq!(Parser::new(MAX).parse(&long[..MAX - 1]), Ok(None));
        let mut line = vec![b'a'; MAX - 1];
        line.push(b'\n');
        assert_eq!(Parser::new(MAX).parse(&line), Ok(Some(MAX)));
        // Trickled in, the same line is refused at the same point.
        let mut p = Parser::new(MAX);
        for cut in 1..MAX {
            assert_eq!(p.parse(&long[..cut]), Ok(None));
        }
        assert_eq!(p.parse(&long), Err(ParseError::InlineTooBig));
        // Too many words on one line.
        let many = "a ".repeat(ARGS_MAX + 1) + "\n";
        assert_eq!(
            Parser::new(4 * MAX).parse(many.as_bytes()),
            Err(ParseError::TooManyArgs)
        );
        let enough = "a ".repeat(ARGS_MAX) + "\n";
        assert!(Parser::new(4 * MAX)
            .parse(enough.as_bytes())
            .unwrap()
            .is_some());
    }

    #[test]
    fn error_texts_are_redis_texts() {
        assert_eq!(
            ParseError::MultibulkLength.to_string(),
            "Protocol error: invalid multibulk length"
        );
        assert_eq!(
            ParseError::BulkLength.to_string(),
            "Protocol error: invalid bulk length"
        );
        assert_eq!(
            ParseError::ExpectedBulk(b':').to_string(),
            "Protocol error: expected '$', got ':'"
        );
        assert_eq!(
            ParseError::UnbalancedQuotes.to_string(),
            "Protocol error: unbalanced quotes in request"
        );
        assert_eq!(
            ParseError::InlineTooBig.to_string(),
            "Protocol error: too big inline request"
        );
    }

    #[test]
    fn arguments_point_into_the_buffer() {
        let input = b"*2\r\n$4\r\nECHO\r\n$3\r\nabc\r\n";
        let mut p = Parser::new(MAX);
        assert_eq!(p.parse(input), Ok(Some(input.len())));
        let args = p.args(input);
        assert_eq!(args.len(), 2);
        assert_eq!(args.get(0), Some(&b"ECHO"[..]));
        assert_eq!(args.get(1), Some(&b"abc"[..]));
        assert_eq!(args.get(2), None);
        assert!(std::ptr::eq(args.get(1).unwrap().as_ptr(), &input[18]));
    }
}
