//! HTP performance votes: what [`Performance::Burst`] asks of the DSP, and withdrawing it.
//!
//! A vote is cast through the device infrastructure (`QnnDevice_getInfrastructure` ->
//! `createPowerConfigId` -> `setPowerConfig`) after the device exists and must be withdrawn
//! (`destroyPowerConfigId`) before the device is freed, so [`super::runtime::Runtime`] owns it.
//! Voting is best effort: a runtime without the perf infrastructure (or one that refuses the
//! vote) runs at its default clocks, and [`PowerState`] says which happened.

use super::Performance;
use super::abi::{self, CoreFunctions, DcvsV3, PowerConfig, PowerConfigValue};
use super::status::Status;

/// Sleep latency of the burst vote, microseconds (the lowest Qualcomm's own integrations use).
pub const BURST_SLEEP_LATENCY_US: u32 = 40;

/// What became of the configured [`Performance`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerState {
    /// No vote was asked for: the runtime's default voting.
    Default,
    /// The burst vote is in force.
    Burst,
    /// Burst was asked for, but the runtime did not take it (why); it runs at default clocks.
    Unsupported(String),
}

/// The DCVS v3 settings of a burst vote: DCVS off, performance mode, the minimum sleep latency,
/// bus and core pinned at the maximum voltage corner. Sleep is not disabled.
pub fn burst(context_id: u32) -> DcvsV3 {
    let max = abi::VOLTAGE_CORNER_MAX;
    DcvsV3 {
        context_id,
        set_dcvs_enable: 1,
        dcvs_enable: 0,
        power_mode: abi::POWER_MODE_PERFORMANCE,
        set_sleep_latency: 1,
        sleep_latency: BURST_SLEEP_LATENCY_US,
        set_sleep_disable: 0,
        sleep_disable: 0,
        set_bus_params: 1,
        bus_voltage_corner_min: max,
        bus_voltage_corner_target: max,
        bus_voltage_corner_max: max,
        set_core_params: 1,
        core_voltage_corner_min: max,
        core_voltage_corner_target: max,
        core_voltage_corner_max: max,
    }
}

/// A vote in force; dropping it withdraws it.
#[derive(Debug)]
pub struct PowerVote {
    id: u32,
    destroy: abi::DestroyPowerConfigIdFn,
}

impl Drop for PowerVote {
    fn drop(&mut self) {
        // SAFETY: `id` came from `createPowerConfigId` of the same (never unloaded) library and
        // is destroyed once, before the device and backend are freed.
        unsafe { (self.destroy)(self.id) };
    }
}

/// Casts the vote `performance` asks for. `Ok(None)` for [`Performance::Default`]; `Err` says why
/// the runtime did not take a burst vote.
pub fn vote(core: &CoreFunctions, performance: Performance) -> Result<Option<PowerVote>, String> {
    if performance == Performance::Default {
        return Ok(None);
    }
    let get = core.device_get_infrastructure.ok_or("the runtime has no deviceGetInfrastructure")?;
    let mut infra: *const abi::HtpDeviceInfrastructure = std::ptr::null();
    // SAFETY: `infra` is an out-parameter the runtime points at its own infrastructure object,
    // which lives as long as the backend library (never unloaded).
    let rc = unsafe { get(&mut infra) };
    if rc != abi::SUCCESS {
        return Err(format!("deviceGetInfrastructure failed: {}", Status::from_handle(rc)));
    }
    // SAFETY: non-null pointers from a successful call point at a live infrastructure object.
    let infra = unsafe { infra.as_ref() }.ok_or("deviceGetInfrastructure returned no object")?;
    if infra.infra_type != abi::HTP_INFRASTRUCTURE_TYPE_PERF {
        return Err(format!("the device infrastructure has type {}, not the HTP perf type", infra.infra_type));
    }
    let perf = infra.perf;
    let (Some(create), Some(destroy), Some(set)) =
        (perf.create_power_config_id, perf.destroy_power_config_id, perf.set_power_config)
    else {
        return Err("the perf infrastructure lacks createPowerConfigId/destroyPowerConfigId/setPowerConfig".into());
    };
    let mut id = 0u32;
    // SAFETY: device 0, core 0 (the single HTP); `id` is an out-parameter.
    let rc = unsafe { create(0, 0, &mut id) };
    if rc != abi::SUCCESS {
        return Err(format!("createPowerConfigId failed: {}", Status::from_handle(rc)));
    }
    let vote = PowerVote { id, destroy };
    let config = PowerConfig { option: abi::POWER_CONFIG_DCVS_V3, value: PowerConfigValue { dcvs_v3: burst(id) } };
    let list = [&config as *const PowerConfig, std::ptr::null()];
    // SAFETY: a NULL-terminated list of one config that outlives the call; `id` is live.
    let rc = unsafe { set(id, list.as_ptr()) };
    if rc != abi::SUCCESS {
        return Err(format!("setPowerConfig failed: {}", Status::from_handle(rc))); // `vote` withdraws the id
    }
    Ok(Some(vote))
}
