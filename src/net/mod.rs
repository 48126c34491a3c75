//! The pod network, set up inside the pod's network namespace through netlink.
//!
//! Discovery of the pod interface, the masquerade binding (bridge `k6t-eth0`, tap `tap0`, nftables
//! NAT rules as KubeVirt v1.9.0 writes them) and the bridge binding, and the in-process DHCPv4/DHCPv6
//! server that hands the guest its address. No `ip`, `nft` or dnsmasq binary is run.
