//! The commands the RESP listener answers, and its replies.
//!
//! This is the coordinator part of each command: recognise it (names are
//! case-insensitive), check its arity and arguments, and say what to do
//! ([`Command`]) or what to answer ([`Reply`]). The connection carries a
//! [`Command`] out; `CL.THROTTLE`'s shard part is `Table::cell_throttle` on
//! the shard that owns the key.
//!
//! | command | reply |
//! |---|---|
//! | `PING [message]` | `+PONG`, or the message as a bulk string |
//! | `ECHO message` | the message |
//! | `QUIT` | `+OK`, then the connection closes |
//! | `INFO [section ...]` | server, clients, shard and replication facts |
//! | `AUTH [default] token` | `+OK` when it matches `--auth-token` |
//! | `CONFIG GET name ...` | pairs for the few settings tools ask about |
//! | `ROLE` | Redis's shape: `master` or `slave`, with offsets |
//! | `CL.THROTTLE key max_burst count period [quantity]` | redis-cell's five integers |
//! | `HELLO [2\|3 [AUTH user token] [SETNAME name]]` | the connection's facts; switches RESP2/RESP3 |
//! | `SELECT 0` | `+OK` (there is one database) |
//! | `CLIENT SETNAME / GETNAME / SETINFO / ID` | what client libraries send on connect |
//! | `COMMAND [DOCS \| COUNT \| INFO ...]` | empty answers, for clients that probe |
//!
//! Replies are RESP2 until `HELLO 3`, then RESP3 where the two differ
//! (maps, nulls); CL.THROTTLE's array of integers is the same in both.
//!
//! Anything else is `-ERR unknown command ...`, word for word as Redis
//! says it. With `--auth-token` set, every command but AUTH and QUIT needs
//! AUTH first (`-NOAUTH`), checked after the name and arity as in Redis.

use bytes::{BufMut, BytesMut};
use sluice_protocol::cell::{self, CellRequest, CellVerdict};

use super::parser::Args;

/// Bytes of the command name and of its arguments quoted back in
/// "unknown command" (Redis's limit).
const UNKNOWN_ECHO_BYTES_MAX: usize = 128;

/// A recognised, well-formed command.
#[derive(Debug)]
pub enum Command<'a> {
    /// PING, with an optional message to echo.
    Ping(Option<&'a [u8]>),
    /// ECHO message.
    Echo(&'a [u8]),
    /// QUIT.
    Quit,
    /// INFO, with the section names asked for (none: all).
    Info(Args<'a>),
    /// AUTH.
    Auth {
        /// The user name, if given (only `default` exists).
        user: Option<&'a [u8]>,
        /// The token to check against `--auth-token`.
        token: &'a [u8],
    },
    /// CONFIG GET with the parameter names.
    ConfigGet(Args<'a>),
    /// CL.THROTTLE.
    Throttle(CellRequest<'a>),
    /// ROLE: primary (`master`) or follower (`slave`), in Redis's shape.
    Role,
    /// HELLO: the protocol version asked for (none: keep), AUTH and
    /// SETNAME options.
    Hello {
        /// 2 or 3.
        proto: Option<u8>,
        /// `AUTH user token`.
        auth: Option<(&'a [u8], &'a [u8])>,
        /// `SETNAME name`.
        name: Option<&'a [u8]>,
    },
    /// SELECT of database 0 (the only one).
    Select,
    /// CLIENT SETNAME name.
    SetName(&'a [u8]),
    /// CLIENT GETNAME.
    GetName,
    /// CLIENT ID.
    ClientId,
    /// CLIENT SETINFO (library name and version: accepted, not kept).
    SetInfo,
    /// COMMAND and its DOCS, COUNT, INFO, LIST: nothing to describe.
    CommandProbe(CommandProbe),
}

/// What a COMMAND probe asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandProbe {
    /// COMMAND, COMMAND INFO, COMMAND LIST: an empty array.
    List,
    /// COMMAND DOCS: an empty map.
    Docs,
    /// COMMAND COUNT: 0.
    Count,
}

impl Command<'_> {
    /// Whether the command needs an authenticated connection (HELLO
    /// checks for itself: with AUTH it authenticates).
    pub fn needs_auth(&self) -> bool {
        !matches!(
            self,
            Command::Auth { .. } | Command::Quit | Command::Hello { .. }
        )
    }
}

/// A value inside a map reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A bulk string.
    Bulk(Vec<u8>),
    /// An integer.
    Int(i64),
    /// An empty array.
    Empty,
}

/// One reply, in RESP2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// CL.THROTTLE's array of five integers.
    Cell(CellVerdict),
    /// A simple string (`+OK`, `+PONG`).
    Simple(&'static str),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// An array of bulk strings.
    Array(Vec<Vec<u8>>),
    /// A reply already encoded (ROLE's nested, mixed array).
    Raw(Vec<u8>),
    /// An integer.
    Int(i64),
    /// No value: RESP2's null bulk string, RESP3's null.
    Null,
    /// Pairs: RESP3's map, RESP2's flat array (HELLO, COMMAND DOCS).
    Map(Vec<(&'static str, Field)>),
    /// An error: the code and text after the `-`.
    Error(String),
}

impl Reply {
    /// About how many bytes this reply takes, held and encoded (what a
    /// reply waiting behind a forwarded CL.THROTTLE counts against the
    /// connection's reply bound).
    pub fn weight(&self) -> usize {
        let heap = match self {
            Reply::Bulk(b) | Reply::Raw(b) => b.capacity(),
            Reply::Array(items) => items.iter().map(|i| i.capacity() + 16).sum(),
            Reply::Map(fields) => fields.len() * 64,
            Reply::Error(text) => text.capacity(),
            Reply::Cell(_) | Reply::Simple(_) | Reply::Int(_) | Reply::Null => 0,
        };
        std::mem::size_of::<Reply>() + heap
    }

    /// `-NOAUTH`, for a command before AUTH.
    pub fn no_auth() -> Reply {
        Reply::Error("NOAUTH Authentication required.".to_owned())
    }

    /// `-WRONGPASS`, for an AUTH with the wrong token.
    pub fn wrong_pass() -> Reply {
        Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".to_owned())
    }

    /// `-ERR text`.
    pub fn err(text: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {text}"))
    }
}

/// Recognises and checks a command. `Ok(None)` for an empty one (skipped,
/// no reply); `Err(reply)` answers a bad one.
pub fn parse<'a>(args: &Args<'a>) -> Result<Option<Command<'a>>, Reply> {
    let Some(name) = args.get(0) else {
        return Ok(None);
    };
    let argc = args.len() - 1;
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    let command = if is_cl_throttle(name) {
        Command::Throttle(throttle(args)?)
    } else if is("PING") {
        arity(argc <= 1, "ping")?;
        Command::Ping(args.get(1))
    } else if is("ECHO") {
        arity(argc == 1, "echo")?;
        Command::Echo(args.get(1).unwrap_or_default())
    } else if is("QUIT") {
        Command::Quit
    } else if is("INFO") {
        Command::Info(*args)
    } else if is("ROLE") {
        arity(argc == 0, "role")?;
        Command::Role
    } else if is("AUTH") {
        arity((1..=2).contains(&argc), "auth")?;
        let token = args.get(argc).unwrap_or_default();
        let user = (argc == 2).then(|| args.get(1)).flatten();
        Command::Auth { user, token }
    } else if is("HELLO") {
        hello(args)?
    } else if is("SELECT") {
        arity(argc == 1, "select")?;
        if args.get(1) != Some(b"0".as_slice()) {
            return Err(Reply::err("DB index is out of range"));
        }
        Command::Select
    } else if is("CLIENT") {
        client(args)?
    } else if is("COMMAND") {
        command_probe(args)?
    } else if is("CONFIG") {
        arity(argc >= 1, "config")?;
        let sub = args.get(1).unwrap_or_default();
        if !sub.eq_ignore_ascii_case(b"GET") {
            let sub = printable(sub, UNKNOWN_ECHO_BYTES_MAX);
            return Err(Reply::err(format_args!(
                "unknown subcommand '{sub}'. Try CONFIG HELP."
            )));
        }
        arity(argc >= 2, "config|get")?;
        Command::ConfigGet(*args)
    } else {
        return Err(unknown(args));
    };
    Ok(Some(command))
}

/// `Err` with Redis's text unless `ok`: command `n` was given a wrong
/// number of arguments.
fn arity(ok: bool, n: &str) -> Result<(), Reply> {
    if ok {
        Ok(())
    } else {
        Err(Reply::err(format_args!(
            "wrong number of arguments for '{n}' command"
        )))
    }
}

/// CLIENT's subcommands: SETNAME, GETNAME, ID and SETINFO.
fn client<'a>(args: &Args<'a>) -> Result<Command<'a>, Reply> {
    let argc = args.len() - 1;
    arity(argc >= 1, "client")?;
    let sub = args.get(1).unwrap_or_default();
    let sub_is = |n: &str| sub.eq_ignore_ascii_case(n.as_bytes());
    if sub_is("SETNAME") {
        arity(argc == 2, "client|setname")?;
        let name = args.get(2).unwrap_or_default();
        if name.iter().any(|&b| b <= b' ' || b > b'~') {
            return Err(Reply::err(
                "Client names cannot contain spaces, newlines or special characters.",
            ));
        }
        Ok(Command::SetName(name))
    } else if sub_is("GETNAME") {
        arity(argc == 1, "client|getname")?;
        Ok(Command::GetName)
    } else if sub_is("ID") {
        arity(argc == 1, "client|id")?;
        Ok(Command::ClientId)
    } else if sub_is("SETINFO") {
        arity(argc == 3, "client|setinfo")?;
        Ok(Command::SetInfo)
    } else {
        let sub = printable(sub, UNKNOWN_ECHO_BYTES_MAX);
        Err(Reply::err(format_args!(
            "unknown subcommand '{sub}'. Try CLIENT HELP."
        )))
    }
}

/// COMMAND (what redis-cli and client libraries ask on connecting): its
/// INFO, LIST, DOCS and COUNT.
fn command_probe<'a>(args: &Args<'a>) -> Result<Command<'a>, Reply> {
    let argc = args.len() - 1;
    let sub = args.get(1).unwrap_or_default();
    let sub_is = |n: &str| sub.eq_ignore_ascii_case(n.as_bytes());
    let probe = if argc == 0 || sub_is("INFO") || sub_is("LIST") {
        CommandProbe::List
    } else if sub_is("DOCS") {
        CommandProbe::Docs
    } else if sub_is("COUNT") {
        CommandProbe::Count
    } else {
        let sub = printable(sub, UNKNOWN_ECHO_BYTES_MAX);
        return Err(Reply::err(format_args!(
            "unknown subcommand '{sub}'. Try COMMAND HELP."
        )));
    };
    Ok(Command::CommandProbe(probe))
}

/// HELLO's arguments, with Redis's checks and texts.
fn hello<'a>(args: &Args<'a>) -> Result<Command<'a>, Reply> {
    let mut proto = None;
    let (mut auth, mut name) = (None, None);
    if let Some(v) = args.get(1) {
        proto = match v {
            b"2" => Some(2),
            b"3" => Some(3),
            _ if v.iter().all(u8::is_ascii_digit) && !v.is_empty() => {
                return Err(Reply::Error("NOPROTO unsupported protocol version".into()))
            }
            _ => {
                return Err(Reply::err(
                    "Protocol version is not an integer or out of range",
                ))
            }
        };
    }
    let mut i = 2;
    while let Some(opt) = args.get(i) {
        let left = args.len() - i - 1;
        if opt.eq_ignore_ascii_case(b"AUTH") && left >= 2 {
            auth = Some((
                args.get(i + 1).unwrap_or_default(),
                args.get(i + 2).unwrap_or_default(),
            ));
            i += 3;
        } else if opt.eq_ignore_ascii_case(b"SETNAME") && left >= 1 {
            name = Some(args.get(i + 1).unwrap_or_default());
            i += 2;
        } else {
            let opt = printable(opt, UNKNOWN_ECHO_BYTES_MAX);
            return Err(Reply::err(format_args!(
                "Syntax error in HELLO option '{opt}'"
            )));
        }
    }
    Ok(Command::Hello { proto, auth, name })
}

/// `name.eq_ignore_ascii_case(b"CL.THROTTLE")`, in two word compares
/// (the byte loop was about 75 instructions of every CL.THROTTLE): the
/// 0x20 bit is forced on at the letters' places only, where it is exactly
/// ASCII lowercasing; the `.` is compared as it is.
#[inline]
fn is_cl_throttle(name: &[u8]) -> bool {
    const LETTERS: u64 = u64::from_le_bytes([0x20, 0x20, 0, 0x20, 0x20, 0x20, 0x20, 0x20]);
    let (Some(head), Some(tail)) = (name.first_chunk::<8>(), name.last_chunk::<4>()) else {
        return false;
    };
    name.len() == 11
        && u64::from_le_bytes(*head) | LETTERS == u64::from_le_bytes(*b"cl.throt")
        && u32::from_le_bytes(*tail) | 0x2020_2020 == u32::from_le_bytes(*b"ttle")
}

/// CL.THROTTLE's arguments, with redis-cell's checks and texts.
fn throttle<'a>(args: &Args<'a>) -> Result<CellRequest<'a>, Reply> {
    let argc = args.len() - 1;
    if !(cell::ARGS_MIN..=cell::ARGS_MAX).contains(&argc) {
        return Err(cell_error(&cell::CellError::Usage));
    }
    let mut rest: [&[u8]; cell::ARGS_MAX] = [&[]; cell::ARGS_MAX];
    for (i, arg) in rest.iter_mut().enumerate().take(argc) {
        *arg = args.get(i + 1).unwrap_or_default();
    }
    CellRequest::parse(&rest[..argc]).map_err(|e| cell_error(&e))
}

/// redis-cell's error reply: its module wraps every error this way.
fn cell_error(e: &cell::CellError) -> Reply {
    Reply::Error(format!("Cell error: Store error: {e}"))
}

/// Redis's answer to an unknown command, quoting its name and the start
/// of its arguments.
fn unknown(args: &Args<'_>) -> Reply {
    let name = printable(args.get(0).unwrap_or_default(), UNKNOWN_ECHO_BYTES_MAX);
    let mut quoted = String::new();
    for arg in args.iter().skip(1) {
        if quoted.len() >= UNKNOWN_ECHO_BYTES_MAX {
            break;
        }
        let room = UNKNOWN_ECHO_BYTES_MAX - quoted.len();
        quoted.push('\'');
        quoted.push_str(&printable(arg, room));
        quoted.push_str("' ");
    }
    Reply::err(format_args!(
        "unknown command '{name}', with args beginning with: {quoted}"
    ))
}

/// Up to `max` bytes of `bytes` as text (invalid UTF-8 replaced).
fn printable(bytes: &[u8], max: usize) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(max)]).into_owned()
}

/// Appends `reply` to `buf` in RESP `proto` (2 or 3).
pub fn encode(buf: &mut BytesMut, reply: &Reply, proto: u8) {
    match reply {
        Reply::Int(n) => put_int(buf, b':', *n),
        Reply::Null if proto >= 3 => buf.extend_from_slice(b"_\r\n"),
        Reply::Null => buf.extend_from_slice(b"$-1\r\n"),
        Reply::Map(pairs) => {
            if proto >= 3 {
                put_len(buf, b'%', pairs.len());
            } else {
                put_len(buf, b'*', 2 * pairs.len());
            }
            for (k, v) in pairs {
                put_bulk(buf, k.as_bytes());
                match v {
                    Field::Bulk(b) => put_bulk(buf, b),
                    Field::Int(n) => put_int(buf, b':', *n),
                    Field::Empty => buf.extend_from_slice(b"*0\r\n"),
                }
            }
        }
        Reply::Cell(v) => {
            // The reply to every CL.THROTTLE: assembled whole on the stack,
            // copied once.
            let mut out = [0u8; 4 + 5 * INT_BYTES_MAX];
            out[..4].copy_from_slice(b"*5\r\n");
            let mut at = 4;
            for n in v.reply() {
                at = int_at(&mut out, at, b':', n);
            }
            buf.extend_from_slice(&out[..at]);
        }
        Reply::Simple(s) => {
            buf.put_u8(b'+');
            buf.extend_from_slice(s.as_bytes());
            buf.extend_from_slice(b"\r\n");
        }
        Reply::Bulk(data) => put_bulk(buf, data),
        Reply::Array(items) => {
            put_len(buf, b'*', items.len());
            for item in items {
                put_bulk(buf, item);
            }
        }
        Reply::Raw(bytes) => buf.extend_from_slice(bytes),
        Reply::Error(text) => {
            buf.put_u8(b'-');
            // A CR or LF inside an error line would end it early: Redis
            // turns them into spaces, and so do we.
            buf.extend(
                text.bytes()
                    .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
            );
            buf.extend_from_slice(b"\r\n");
        }
    }
}

fn put_bulk(buf: &mut BytesMut, data: &[u8]) {
    put_len(buf, b'$', data.len());
    buf.extend_from_slice(data);
    buf.extend_from_slice(b"\r\n");
}

fn put_len(buf: &mut BytesMut, kind: u8, len: usize) {
    put_int(buf, kind, i64::try_from(len).unwrap_or(i64::MAX));
}

/// `KIND n CRLF`, formatted without allocating.
fn put_int(buf: &mut BytesMut, kind: u8, n: i64) {
    let mut out = [0u8; INT_BYTES_MAX];
    let end = int_at(&mut out, 0, kind, n);
    buf.extend_from_slice(&out[..end]);
}

/// The longest `KIND n CRLF`: kind, sign, 19 digits, CR LF.
const INT_BYTES_MAX: usize = 1 + 1 + 19 + 2;

/// Writes `KIND n CRLF` into `out` from `at` (which has room for
/// [`INT_BYTES_MAX`] bytes), returning where it ends. The digits go
/// straight to their places (their count first), with no buffer between:
/// the five integers of a CL.THROTTLE reply, mostly one to three digits,
/// took 72 instructions each through a digit buffer and a copy.
#[inline(always)]
fn int_at(out: &mut [u8], mut at: usize, kind: u8, n: i64) -> usize {
    out[at] = kind;
    at += 1;
    if n < 0 {
        out[at] = b'-';
        at += 1;
    }
    let mut v = n.unsigned_abs();
    // Most reply integers have one or two digits (0/1, remaining, -1,
    // seconds): those without the logarithm.
    let len = match v {
        0..=9 => 1,
        10..=99 => 2,
        _ => v.ilog10() as usize + 1,
    };
    // Two digits a step, from a table (a digit a step, `% 10` and `/ 10`,
    // was about 60 of the 400 instructions a CL.THROTTLE reply took).
    let end = at + len;
    let mut i = end;
    while v >= 100 {
        let pair = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        out[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if v >= 10 {
        let pair = v as usize * 2;
        out[i - 2..i].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        out[i - 1] = b'0' + v as u8;
    }
    out[end..end + 2].copy_from_slice(b"\r\n");
    end + 2
}

/// "00", "01", ... "99": the two digits of each number below 100.
const DIGIT_PAIRS: [u8; 200] = {
    let mut t = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        t[2 * i] = b'0' + (i / 10) as u8;
        t[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::parser::Parser;

    /// Parses `input` (one whole command) and runs `f` on the result.
    fn with<R>(input: &str, f: impl FnOnce(Result<Option<Command<'_>>, Reply>) -> R) -> R {
        let mut p = Parser::new(1 << 20);
        let line = format!("{input}\r\n");
        assert_eq!(p.parse(line.as_bytes()), Ok(Some(line.len())));
        f(parse(&p.args(line.as_bytes())))
    }

    fn error(input: &str) -> String {
        with(input, |r| match r {
            Err(Reply::Error(e)) => e,
            other => panic!("{input}: {other:?}"),
        })
    }

    proptest::proptest! {
        /// Integers are written as Rust formats them, after the kind byte,
        /// at any offset, with nothing written past their CRLF.
        #[test]
        fn integers_are_written_as_formatted(
            n in proptest::prop_oneof![proptest::num::i64::ANY, -1000i64..1000],
            at in 0usize..8,
        ) {
            let mut out = [0xAAu8; 8 + INT_BYTES_MAX + 1];
            let end = int_at(&mut out, at, b':', n);
            let want = format!(":{n}\r\n");
            proptest::prop_assert_eq!(&out[at..end], want.as_bytes());
            proptest::prop_assert!(out[..at].iter().chain(&out[end..]).all(|&b| b == 0xAA));
        }
    }

    /// The name check is `eq_ignore_ascii_case`, over every case mix and
    /// every one-byte change of the name (0x0E | 0x20 is `.`, but 0x0E
    /// is not a `.`).
    #[test]
    fn the_throttle_name_check_is_a_case_blind_compare() {
        let name = *b"CL.THROTTLE";
        for mask in 0u32..1 << 11 {
            let mut n = name;
            for (i, b) in n.iter_mut().enumerate() {
                if mask & (1 << i) != 0 {
                    *b = b.to_ascii_lowercase();
                }
            }
            assert!(is_cl_throttle(&n));
            for i in 0..n.len() {
                for b in 0..=255u8 {
                    let mut m = n;
                    m[i] = b;
                    assert_eq!(is_cl_throttle(&m), m.eq_ignore_ascii_case(&name), "{m:?}");
                }
            }
        }
        for other in [&b""[..], b"CL.THROTTL", b"CL.THROTTLEX", b"PING"] {
            assert!(!is_cl_throttle(other));
        }
    }

    fn encoded(r: &Reply) -> String {
        encoded_in(r, 2)
    }

    fn encoded_in(r: &Reply, proto: u8) -> String {
        let mut buf = BytesMut::new();
        encode(&mut buf, r, proto);
        String::from_utf8(buf.to_vec()).unwrap()
    }

    #[test]
    fn hello_select_client_and_command_parse_as_redis_does() {
        with("HELLO 3 AUTH default t SETNAME gw", |r| match r {
            Ok(Some(Command::Hello { proto, auth, name })) => {
                assert_eq!(proto, Some(3));
                assert_eq!(auth, Some((b"default".as_slice(), b"t".as_slice())));
                assert_eq!(name, Some(b"gw".as_slice()));
            }
            other => panic!("{other:?}"),
        });
        with("hello", |r| {
            assert!(matches!(r, Ok(Some(Command::Hello { proto: None, .. }))))
        });
        assert_eq!(error("HELLO 4"), "NOPROTO unsupported protocol version");
        assert!(error("HELLO 3 BOGUS").starts_with("ERR Syntax error in HELLO option"));
        with("SELECT 0", |r| {
            assert!(matches!(r, Ok(Some(Command::Select))))
        });
        assert_eq!(error("SELECT 1"), "ERR DB index is out of range");
        with("client setname a", |r| {
            assert!(matches!(r, Ok(Some(Command::SetName(b"a")))))
        });
        with("CLIENT GETNAME", |r| {
            assert!(matches!(r, Ok(Some(Command::GetName))))
        });
        with("CLIENT SETINFO LIB-NAME redis-py", |r| {
            assert!(matches!(r, Ok(Some(Command::SetInfo))))
        });
        with("COMMAND DOCS", |r| {
            assert!(matches!(
                r,
                Ok(Some(Command::CommandProbe(CommandProbe::Docs)))
            ))
        });
    }

    #[test]
    fn maps_and_nulls_differ_between_resp2_and_resp3() {
        let map = Reply::Map(vec![("proto", Field::Int(3)), ("modules", Field::Empty)]);
        assert_eq!(
            encoded_in(&map, 3),
            "%2\r\n$5\r\nproto\r\n:3\r\n$7\r\nmodules\r\n*0\r\n"
        );
        assert_eq!(
            encoded_in(&map, 2),
            "*4\r\n$5\r\nproto\r\n:3\r\n$7\r\nmodules\r\n*0\r\n"
        );
        assert_eq!(encoded_in(&Reply::Null, 3), "_\r\n");
        assert_eq!(encoded_in(&Reply::Null, 2), "$-1\r\n");
        assert_eq!(encoded_in(&Reply::Int(-7), 3), ":-7\r\n");
    }

    #[test]
    fn commands_are_recognised_in_any_case() {
        with("ping", |r| {
            assert!(matches!(r, Ok(Some(Command::Ping(None)))))
        });
        with("PiNg hi", |r| {
            assert!(matches!(r, Ok(Some(Command::Ping(Some(b"hi"))))))
        });
        with("echo x", |r| {
            assert!(matches!(r, Ok(Some(Command::Echo(b"x")))))
        });
        with("quit", |r| assert!(matches!(r, Ok(Some(Command::Quit)))));
        with("info server", |r| {
            assert!(matches!(r, Ok(Some(Command::Info(_)))))
        });
        with("auth secret", |r| {
            assert!(matches!(
                r,
                Ok(Some(Command::Auth {
                    user: None,
                    token: b"secret"
                }))
            ))
        });
        with("auth default secret", |r| {
            let Ok(Some(Command::Auth {
                user: Some(b"default"),
                token: b"secret",
            })) = r
            else {
                panic!("{r:?}");
            };
        });
        with("config get save", |r| {
            assert!(matches!(r, Ok(Some(Command::ConfigGet(_)))))
        });
        with("cl.throttle user123 15 30 60 1", |r| {
            let Ok(Some(Command::Throttle(t))) = r else {
                panic!("{r:?}")
            };
            assert_eq!(t.key, b"user123");
            assert_eq!(t.quantity, 1);
            assert_eq!(t.policy.limit, 16);
        });
        with("", |r| assert!(matches!(r, Ok(None))));
    }

    #[test]
    fn errors_are_redis_errors() {
        assert_eq!(
            error("FOO a b"),
            "ERR unknown command 'FOO', with args beginning with: 'a' 'b' "
        );
        assert_eq!(
            error("foo"),
            "ERR unknown command 'foo', with args beginning with: "
        );
        let long = "x".repeat(300);
        let e = error(&format!("{long} {long} {long}"));
        assert!(e.len() < 400, "{} bytes", e.len());
        assert_eq!(
            error("echo"),
            "ERR wrong number of arguments for 'echo' command"
        );
        assert_eq!(
            error("echo a b"),
            "ERR wrong number of arguments for 'echo' command"
        );
        assert_eq!(
            error("ping a b"),
            "ERR wrong number of arguments for 'ping' command"
        );
        assert_eq!(
            error("auth"),
            "ERR wrong number of arguments for 'auth' command"
        );
        assert_eq!(
            error("config"),
            "ERR wrong number of arguments for 'config' command"
        );
        assert_eq!(
            error("config set a b"),
            "ERR unknown subcommand 'set'. Try CONFIG HELP."
        );
        assert_eq!(
            error("CL.THROTTLE k 1 1"),
            "Cell error: Store error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]"
        );
        assert_eq!(
            error("CL.THROTTLE k 1 x 1"),
            "Cell error: Store error: Couldn't parse as integer: x"
        );
        assert_eq!(
            error("CL.THROTTLE k 1 0 1"),
            "Cell error: Store error: Zero rates are not supported"
        );
        assert_eq!(
            error("CL.THROTTLE k 1 1 1 -1"),
            "Cell error: Store error: quantity must not be negative"
        );
        // 114 years to refill: refused, with the reason (README).
        assert_eq!(
            error("CL.THROTTLE k 1000000 1 3600"),
            "Cell error: Store error: (max_burst + 1) x period / count must be at most 3162240000 seconds"
        );
    }

    #[test]
    fn replies_encode_as_resp2() {
        let v = CellVerdict {
            limited: false,
            limit: 16,
            remaining: 15,
            retry_after_ns: -1_000_000_000,
            reset_after_ns: 2_000_000_000,
        };
        assert_eq!(
            encoded(&Reply::Cell(v)),
            "*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n"
        );
        assert_eq!(encoded(&Reply::Simple("PONG")), "+PONG\r\n");
        assert_eq!(
            encoded(&Reply::Bulk(b"a\r\nb".to_vec())),
            "$4\r\na\r\nb\r\n"
        );
        assert_eq!(encoded(&Reply::Bulk(Vec::new())), "$0\r\n\r\n");
        assert_eq!(
            encoded(&Reply::Array(vec![b"save".to_vec(), Vec::new()])),
            "*2\r\n$4\r\nsave\r\n$0\r\n\r\n"
        );
        assert_eq!(encoded(&Reply::err("a\r\nb")), "-ERR a  b\r\n");
        // The longest integers, five of them: the reply's stack buffer holds them.
        let v = CellVerdict {
            limited: true,
            limit: i64::MIN,
            remaining: i64::MAX,
            retry_after_ns: i64::MIN,
            reset_after_ns: i64::MIN,
        };
        assert_eq!(
            encoded(&Reply::Cell(v)),
            format!(
                "*5\r\n:1\r\n:{}\r\n:{}\r\n:{}\r\n:{}\r\n",
                i64::MIN,
                i64::MAX,
                v.retry_after_s(),
                v.reset_after_s()
            )
        );
        let mut buf = BytesMut::new();
        for n in [0, 7, -7, i64::MAX, i64::MIN] {
            buf.clear();
            put_int(&mut buf, b':', n);
            assert_eq!(buf, format!(":{n}\r\n").as_bytes());
        }
    }
}
