/** The budget's etcd backends: the fleet view. */
export { type EtcdFleetOptions, EtcdFleetPublisher, FLEET_PREFIX, fleetKey } from "./etcd-fleet.js";
