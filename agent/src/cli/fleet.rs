//! `laya-edge fleet`: a live view of every device under a prefix, from what they publish (status,
//! telemetry, events); a client of the broker only. The state is `service::fleet`, the drawing
//! `service::fleet_view`; this module connects, feeds and redraws.

use std::io::Write;
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};

use crate::client::{fleet::Fleet, fleet_view};
use crate::service;
use laya_topics::topic::Schema;
use laya_topics::wire::Encoding;

#[derive(clap::Args)]
pub struct Args {
    /// The broker, `mqtt://host:port` (`serve --demo` prints its own).
    #[arg(long, default_value = "mqtt://localhost:1883")]
    broker: String,
    /// The topic prefix the devices use (`mqtt.prefix`).
    #[arg(long, default_value = laya_topics::topic::DEFAULT_PREFIX)]
    prefix: String,
    /// Only the devices of this fleet (`mqtt.fleet` in their configuration).
    #[arg(long)]
    fleet: Option<String>,
    /// Print one snapshot once every online device has sent its telemetry (its figures), at most
    /// `--window-s` seconds after connecting, then exit.
    #[arg(long)]
    once: bool,
    /// Print JSON (`{"devices": [...]}`, one document per refresh) instead of a table.
    #[arg(long)]
    json: bool,
    /// The most `--once` listens before printing (retained statuses arrive at once, telemetry
    /// every `telemetry_interval_s`: 60 s by default, 2 s in `serve --demo`).
    #[arg(long, default_value_t = 10)]
    window_s: u64,
    /// Seconds between redraws of the live view.
    #[arg(long, default_value_t = 1)]
    refresh_s: u64,
    /// With the shipped ACL, an operator's login (it reads telemetry and events).
    #[command(flatten)]
    login: super::Login,
}

pub fn run(args: Args) -> Result<(), String> {
    super::runtime()?.block_on(watch(args))
}

fn print(fleet: &Fleet, args: &Args, live: bool) {
    let rows = fleet.rows(Instant::now());
    let text = if args.json {
        laya_topics::json::to_string(&fleet_view::json(&rows), laya_topics::json::Style::COMPACT) + "\n"
    } else {
        fleet_view::table(&rows, 60)
    };
    let mut out = std::io::stdout().lock();
    // Live tables are redrawn in place: cursor home, clear the screen.
    let clear = if live && !args.json { "\x1b[H\x1b[2J" } else { "" };
    let _ = write!(out, "{clear}{text}");
    let _ = out.flush();
}

async fn watch(args: Args) -> Result<(), String> {
    let (host, port, tls) = service::connection::parse_broker(&args.broker).map_err(|e| e.to_string())?;
    if tls {
        return Err("fleet supports mqtt:// only".into());
    }
    let schema = Schema::new(&args.prefix).map_err(|e| e.to_string())?;
    let mut fleet = Fleet::new(schema, args.fleet.clone());
    let mut options = MqttOptions::new(format!("laya-fleet-{}", std::process::id()), host, port);
    options.set_max_packet_size(Some(1 << 20));
    args.login.apply(&mut options)?;
    let (client, mut eventloop) = AsyncClient::new(options, 64);
    let window = tokio::time::sleep(Duration::from_secs(args.window_s));
    tokio::pin!(window);
    let mut refresh = tokio::time::interval(Duration::from_secs(args.refresh_s.max(1)));
    let mut connected = false;
    // `--once` prints early only once every subscription is acknowledged: a broker answers a
    // SUBSCRIBE, then sends its retained messages, before it takes the next SUBSCRIBE on the same
    // connection (mosquitto does), so by the last SUBACK every device's retained status (the first
    // subscription) is in. Before that, the first status in (an offline device's) looked like the
    // whole fleet. A broker that sends them later leaves it to the window.
    let subscriptions = fleet.subscriptions();
    let mut acked = 0;
    loop {
        // Whether the `--once` snapshot is complete.
        let done = tokio::select! {
            event = eventloop.poll() => {
                match event {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        connected = true;
                        acked = 0;
                        for filter in &subscriptions {
                            client.subscribe(filter, QoS::AtMostOnce).await.map_err(|e| e.to_string())?;
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => acked += 1,
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let topic = String::from_utf8_lossy(&p.topic).into_owned();
                        let ct = p.properties.as_ref().and_then(|x| x.content_type.clone());
                        let doc = Encoding::detect(ct.as_deref(), &p.payload).decode(&p.payload, 32).ok();
                        fleet.handle(Instant::now(), &topic, doc.as_ref());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if args.once && !connected {
                            return Err(format!("cannot reach the broker {}: {e}", args.broker));
                        }
                        tracing::warn!(error = %e, "broker connection lost; reconnecting");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                args.once && acked >= subscriptions.len() && !fleet.awaiting_telemetry()
            }
            _ = &mut window, if args.once => true,
            _ = refresh.tick(), if !args.once => {
                print(&fleet, &args, true);
                false
            }
        };
        if done {
            print(&fleet, &args, false);
            let _ = client.disconnect().await;
            return Ok(());
        }
    }
}
