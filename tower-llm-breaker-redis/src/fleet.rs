//! The shared state of a circuit as Redis gives it: script replies,
//! channel messages and hash fields, parsed.

use std::time::Duration;

use tower_llm_breaker::TransitionReason;

/// The shared state of one circuit, as a script or a message gives it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fleet {
    pub(crate) generation: u64,
    pub(crate) state: FleetState,
    pub(crate) rest: Duration,
    pub(crate) reopens: u32,
    pub(crate) reason: TransitionReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FleetState {
    Closed,
    Open,
    Isolated,
    /// Not a state: failures are being counted (a success must reset them).
    Failing,
}

#[derive(Debug, PartialEq)]
pub(crate) enum Reply {
    State(Fleet),
    Counted,
    Reserved {
        generation: u64,
        cooldown: Duration,
        tokens: Vec<String>,
    },
    Nothing,
}

fn reason(label: &str, state: FleetState) -> TransitionReason {
    match label {
        "consecutive_failures" => TransitionReason::ConsecutiveFailures,
        "failure_ratio" => TransitionReason::FailureRatio,
        "probe_failed" => TransitionReason::ProbeFailed,
        "probes_succeeded" => TransitionReason::ProbesSucceeded,
        "closed_by_hand" => TransitionReason::ClosedByHand,
        "isolated" => TransitionReason::Isolated,
        _ => match state {
            FleetState::Open => TransitionReason::ConsecutiveFailures,
            FleetState::Isolated => TransitionReason::Isolated,
            _ => TransitionReason::ProbesSucceeded,
        },
    }
}

fn fleet(generation: &str, state: &str, rest: &str, reopens: &str, why: &str) -> Option<Fleet> {
    let state = match state {
        "closed" => FleetState::Closed,
        "open" => FleetState::Open,
        "isolated" => FleetState::Isolated,
        "failing" => FleetState::Failing,
        _ => return None,
    };
    Some(Fleet {
        generation: generation.parse().ok()?,
        state,
        rest: Duration::from_millis(rest.parse().ok()?),
        reopens: reopens.parse().ok()?,
        reason: reason(why, state),
    })
}

/// Parses a script's reply (see `scripts.rs`); `None` if malformed.
pub(crate) fn parse_reply(v: &[String]) -> Option<Reply> {
    match v.first().map(String::as_str)? {
        "S" => match v {
            [_, g, st, rest, re, why] => fleet(g, st, rest, re, why).map(Reply::State),
            _ => None,
        },
        "C" => Some(Reply::Counted),
        "R" => {
            let generation = v.get(1)?.parse().ok()?;
            let cooldown = Duration::from_millis(v.get(2)?.parse().ok()?);
            Some(Reply::Reserved {
                generation,
                cooldown,
                tokens: v.get(3..)?.to_vec(),
            })
        }
        "N" => Some(Reply::Nothing),
        _ => None,
    }
}

/// Parses a channel message: `(id, state)`.
pub(crate) fn parse_message(payload: &str) -> Option<(&str, Fleet)> {
    let mut parts = payload.splitn(6, '|');
    let (g, st, rest, re, why, id) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    );
    Some((id, fleet(g, st, rest, re, why)?))
}

/// The shared state from `HMGET st until re gen why` at server time `now`
/// (ms); an absent key reads closed.
pub(crate) fn fleet_of_fields(fields: &[Option<String>], now: u64) -> Option<Fleet> {
    let field = |i: usize| fields.get(i).and_then(Option::as_deref);
    let number = |i: usize| field(i).map_or(Some(0), |v| v.parse::<u64>().ok());
    let state = field(0).unwrap_or("closed");
    let rest = if state == "open" {
        number(1)?.saturating_sub(now)
    } else {
        0
    };
    fleet(
        &number(3)?.to_string(),
        state,
        &rest.to_string(),
        &number(2)?.to_string(),
        field(4).unwrap_or("none"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn replies_parse_and_malformed_ones_do_not() {
        assert_eq!(
            parse_reply(&strings(&["S", "17", "open", "250", "2", "probe_failed"])),
            Some(Reply::State(Fleet {
                generation: 17,
                state: FleetState::Open,
                rest: Duration::from_millis(250),
                reopens: 2,
                reason: TransitionReason::ProbeFailed,
            }))
        );
        assert_eq!(
            parse_reply(&strings(&["R", "9", "1000", "a:1", "a:2"])),
            Some(Reply::Reserved {
                generation: 9,
                cooldown: Duration::from_secs(1),
                tokens: strings(&["a:1", "a:2"]),
            })
        );
        assert_eq!(
            parse_reply(&strings(&["S", "x", "open", "1", "0", "y"])),
            None
        );
        assert_eq!(
            parse_reply(&strings(&["S", "1", "weird", "1", "0", "y"])),
            None
        );
        assert_eq!(parse_reply(&strings(&["Q"])), None);
        assert_eq!(parse_reply(&[]), None);
    }

    #[test]
    fn messages_keep_pipes_in_the_id_out() {
        let (id, fleet) = parse_message("5|closed|0|0|closed_by_hand|p/m").expect("parses");
        assert_eq!(id, "p/m");
        assert_eq!(fleet.state, FleetState::Closed);
        assert_eq!(fleet.reason, TransitionReason::ClosedByHand);
        assert!(parse_message("5|closed|0|0").is_none());
    }

    #[test]
    fn a_forgotten_key_reads_closed_and_an_open_one_its_rest() {
        let closed = fleet_of_fields(&[None, None, None, None, None], 1_000).expect("parses");
        assert_eq!((closed.state, closed.generation), (FleetState::Closed, 0));
        let some = |v: &str| Some(v.to_owned());
        let open = fleet_of_fields(
            &[
                some("open"),
                some("1250"),
                some("1"),
                some("7"),
                some("failure_ratio"),
            ],
            1_000,
        )
        .expect("parses");
        assert_eq!(
            open,
            Fleet {
                generation: 7,
                state: FleetState::Open,
                rest: Duration::from_millis(250),
                reopens: 1,
                reason: TransitionReason::FailureRatio,
            }
        );
        assert!(fleet_of_fields(&[some("open"), some("soon")], 1_000).is_none());
    }
}
