//! `laya-edge ask`: publishes one question request over MQTT (to a device or a fleet) with a
//! response topic (`{prefix}/reply/{user name}/{random key}`) and random correlation data, waits
//! for the reply that carries them and prints it; a client of the broker for operators and
//! scripts.

use std::time::Duration;

use crate::client;
use crate::service;
use laya_topics::topic::Schema;
use laya_topics::wire::Encoding;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "mqtt://localhost:1883")]
    broker: String,
    /// The device to ask.
    #[arg(long, required_unless_present = "fleet")]
    device: Option<String>,
    /// Ask a fleet (any of its devices) instead.
    #[arg(long)]
    fleet: Option<String>,
    #[arg(long, default_value = laya_topics::topic::DEFAULT_PREFIX)]
    prefix: String,
    /// Send CBOR instead of JSON.
    #[arg(long)]
    cbor: bool,
    #[arg(long, default_value_t = 30)]
    timeout_s: u64,
    #[command(flatten)]
    login: super::Login,
    /// The request, as JSON.
    request: String,
}

pub fn run(args: Args) -> Result<(), String> {
    super::runtime()?.block_on(ask(args))
}

async fn ask(args: Args) -> Result<(), String> {
    let request = laya_topics::json::parse_str(&args.request, Default::default())
        .map_err(|e| format!("the request is not JSON: {e}"))?;
    let (host, port, tls) = service::connection::parse_broker(&args.broker).map_err(|e| e.to_string())?;
    if tls {
        return Err("ask supports mqtt:// only".into());
    }
    let mut options = rumqttc::v5::MqttOptions::new(format!("laya-ask-{}", std::process::id()), host, port);
    args.login.apply(&mut options)?;
    let schema = Schema::new(&args.prefix).map_err(|e| e.to_string())?;
    let target = client::ask::Target { schema, device: args.device, fleet: args.fleet };
    let encoding = if args.cbor { Encoding::Cbor } else { Encoding::Json };
    let reply = client::ask::ask(options, &target, &request, encoding, Duration::from_secs(args.timeout_s))
        .await
        .map_err(|e| e.to_string())?;
    println!("{}", laya_topics::json::to_string(&reply, laya_topics::json::Style::COMPACT));
    Ok(())
}
