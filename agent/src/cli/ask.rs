//! `laya-edge ask`: publishes one question request over MQTT (to a device or a fleet) with a
//! response topic (`{prefix}/reply/{user name}/{random key}`) and random correlation data, waits
//! for the reply that carries them and prints it; a client of the broker for operators and
//! scripts. Its exit status tells a script what happened ([`ExitStatus`]).

use std::process::ExitCode;
use std::time::Duration;

use crate::client;
use crate::service;
use laya_topics::topic::Schema;
use laya_topics::wire::Encoding;

/// What `ask` exits with: 0 answered, 1 it could not ask (the broker, the request), 2 the device
/// replied with an error (the request refused, or an error in place of a question's answer), 3 no
/// reply in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Answered = 0,
    Failed = 1,
    ErrorReply = 2,
    NoReply = 3,
}

impl From<ExitStatus> for ExitCode {
    fn from(s: ExitStatus) -> ExitCode {
        ExitCode::from(s as u8)
    }
}

#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 answered, 1 could not ask (broker, request), 2 the device replied with an error (the request refused, or an error in place of an answer), 3 no reply in time (the device may be offline or misnamed; the last status seen for it is printed)."
)]
pub struct Args {
    /// The broker, `mqtt://host:port` (`serve --demo` prints its own).
    #[arg(long, default_value = "mqtt://localhost:1883")]
    broker: String,
    /// The device to ask.
    #[arg(long, required_unless_present = "fleet")]
    device: Option<String>,
    /// Ask a fleet (any of its devices) instead.
    #[arg(long)]
    fleet: Option<String>,
    /// The topic prefix the devices use (`mqtt.prefix`).
    #[arg(long, default_value = laya_topics::topic::DEFAULT_PREFIX)]
    prefix: String,
    /// Send CBOR instead of JSON.
    #[arg(long)]
    cbor: bool,
    /// How long to wait for the reply, in seconds.
    #[arg(long, default_value_t = 30)]
    timeout_s: u64,
    #[command(flatten)]
    login: super::Login,
    /// The request, as JSON; `-` reads it from stdin, `@FILE` from a file.
    request: String,
}

/// Asks; the exit status says how it went (a failure to ask at all is the error).
pub fn run(args: Args) -> Result<ExitStatus, String> {
    super::runtime()?.block_on(ask(args))
}

/// The request text `arg` names: itself, stdin (`-`) or a file (`@FILE`).
fn request_text(arg: &str) -> Result<String, String> {
    if arg == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| format!("cannot read stdin: {e}"))?;
        return Ok(text);
    }
    match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}")),
        None => Ok(arg.to_owned()),
    }
}

async fn ask(args: Args) -> Result<ExitStatus, String> {
    let text = request_text(&args.request)?;
    let request =
        laya_topics::json::parse_str(&text, Default::default()).map_err(|e| format!("the request is not JSON: {e}"))?;
    let (host, port, tls) = service::connection::parse_broker(&args.broker).map_err(|e| e.to_string())?;
    if tls {
        return Err("ask supports mqtt:// only".into());
    }
    let mut options = rumqttc::v5::MqttOptions::new(format!("laya-ask-{}", std::process::id()), host, port);
    args.login.apply(&mut options)?;
    let schema = Schema::new(&args.prefix).map_err(|e| e.to_string())?;
    let target = client::ask::Target { schema, device: args.device, fleet: args.fleet };
    let encoding = if args.cbor { Encoding::Cbor } else { Encoding::Json };
    let reply = match client::ask::ask(options, &target, &request, encoding, Duration::from_secs(args.timeout_s)).await
    {
        Ok(reply) => reply,
        Err(e @ client::ask::AskError::Timeout { .. }) => {
            eprintln!("laya-edge ask: {e}");
            return Ok(ExitStatus::NoReply);
        }
        Err(e) => return Err(e.to_string()),
    };
    println!("{}", laya_topics::json::to_string(&reply, laya_topics::json::Style::COMPACT));
    Ok(if has_error(&reply) { ExitStatus::ErrorReply } else { ExitStatus::Answered })
}

/// Whether a reply refuses the request or carries an error in place of a question's answer.
fn has_error(reply: &laya_topics::Value) -> bool {
    reply.get("error").is_some()
        || reply
            .get("answers")
            .and_then(laya_topics::Value::as_object)
            .is_some_and(|answers| answers.values().any(|a| a.get("error").is_some()))
}
