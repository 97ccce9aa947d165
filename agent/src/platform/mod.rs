//! What the agent asks of the machine it runs on: systemd's notify socket and watchdog
//! ([`systemd`]), handing freed heap back ([`heap`]), the board's vitals for telemetry
//! ([`vitals`]), log lines in journald's or a terminal's form ([`logging`]), and a panic's end:
//! logged, then the process's exit ([`panic`]).

pub mod heap;
pub mod logging;
pub mod panic;
pub mod systemd;
pub mod vitals;
