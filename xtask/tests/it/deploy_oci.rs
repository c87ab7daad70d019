//! deploy/oci/: the OpenTofu/Terraform configuration parses (python-hcl2, pinned in
//! xtask/python-requirements.txt), uses only resource and data types of the oracle/oci provider
//! with only the arguments and blocks their documentation names, and holds the facts that make
//! it an Always-Free, working deployment: a 10 Mbps flexible load balancer, the health check on
//! /health at the profile's API port, E2.1.Micro instances with the SSH key and API keys in
//! their metadata, security list defaults equal to the profile's IPv4 CIDRs.
//!
//! No terraform binary or provider can be fetched here, so the names are checked against lists
//! taken from the provider's documentation (oracle/terraform-provider-oci, website/docs/, as
//! published at https://docs.oracle.com/iaas/tools/terraform-provider-oci/latest/docs/):
//!   r/core_vcn, r/core_internet_gateway, r/core_route_table, r/core_security_list (its example
//!   spells the destination ports as tcp_options.min/max), r/core_subnet, r/core_image,
//!   r/core_compute_image_capability_schema (schema_data is a map of JSON strings: the resource's
//!   schema in internal/service/core/core_compute_image_capability_schema_resource.go),
//!   r/core_shape_management, r/core_instance, r/load_balancer_load_balancer,
//!   r/load_balancer_backend_set, r/load_balancer_backend, r/load_balancer_certificate,
//!   r/load_balancer_listener, d/objectstorage_namespace, d/identity_availability_domains,
//!   d/core_compute_global_image_capability_schemas; `timeouts` from the pages' Timeouts section
//!   (guides/changing_timeouts).

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

/// (resource or data, type, the arguments and nested blocks it may have: dotted for nesting,
/// separated by whitespace).
type Schema = (&'static str, &'static str, &'static str);

const SCHEMAS: &[Schema] = &[
    (
        "resource",
        "oci_core_vcn",
        "cidr_block cidr_blocks compartment_id defined_tags display_name dns_label \
         freeform_tags is_ipv6enabled",
    ),
    (
        "resource",
        "oci_core_internet_gateway",
        "compartment_id defined_tags display_name enabled freeform_tags route_table_id \
         vcn_id",
    ),
    (
        "resource",
        "oci_core_route_table",
        "compartment_id defined_tags display_name freeform_tags vcn_id route_rules \
         route_rules.cidr_block route_rules.description route_rules.destination \
         route_rules.destination_type route_rules.network_entity_id",
    ),
    (
        "resource",
        "oci_core_security_list",
        "compartment_id defined_tags display_name freeform_tags vcn_id \
         egress_security_rules egress_security_rules.description \
         egress_security_rules.destination egress_security_rules.destination_type \
         egress_security_rules.protocol egress_security_rules.stateless \
         egress_security_rules.icmp_options egress_security_rules.icmp_options.type \
         egress_security_rules.icmp_options.code egress_security_rules.tcp_options \
         egress_security_rules.tcp_options.min egress_security_rules.tcp_options.max \
         egress_security_rules.tcp_options.source_port_range \
         egress_security_rules.tcp_options.source_port_range.min \
         egress_security_rules.tcp_options.source_port_range.max \
         egress_security_rules.udp_options egress_security_rules.udp_options.min \
         egress_security_rules.udp_options.max ingress_security_rules \
         ingress_security_rules.description ingress_security_rules.source \
         ingress_security_rules.source_type ingress_security_rules.protocol \
         ingress_security_rules.stateless ingress_security_rules.icmp_options \
         ingress_security_rules.icmp_options.type \
         ingress_security_rules.icmp_options.code ingress_security_rules.tcp_options \
         ingress_security_rules.tcp_options.min ingress_security_rules.tcp_options.max \
         ingress_security_rules.tcp_options.source_port_range \
         ingress_security_rules.tcp_options.source_port_range.min \
         ingress_security_rules.tcp_options.source_port_range.max \
         ingress_security_rules.udp_options ingress_security_rules.udp_options.min \
         ingress_security_rules.udp_options.max",
    ),
    (
        "resource",
        "oci_core_subnet",
        "availability_domain cidr_block compartment_id defined_tags dhcp_options_id \
         display_name dns_label freeform_tags prohibit_public_ip_on_vnic route_table_id \
         security_list_ids vcn_id",
    ),
    (
        "resource",
        "oci_core_image",
        "compartment_id defined_tags display_name freeform_tags instance_id launch_mode \
         image_source_details image_source_details.bucket_name \
         image_source_details.namespace_name image_source_details.object_name \
         image_source_details.operating_system \
         image_source_details.operating_system_version \
         image_source_details.source_image_type image_source_details.source_type \
         image_source_details.source_uri",
    ),
    (
        "resource",
        "oci_core_compute_image_capability_schema",
        "compartment_id compute_global_image_capability_schema_version_name defined_tags \
         display_name freeform_tags image_id schema_data",
    ),
    (
        "resource",
        "oci_core_shape_management",
        "compartment_id image_id shape_name",
    ),
    (
        "resource",
        "oci_core_instance",
        "availability_domain compartment_id shape display_name defined_tags freeform_tags \
         fault_domain hostname_label metadata extended_metadata ipxe_script \
         is_pv_encryption_in_transit_enabled preserve_boot_volume capacity_reservation_id \
         dedicated_vm_host_id compute_cluster_id instance_configuration_id async \
         create_vnic_details create_vnic_details.assign_ipv6ip \
         create_vnic_details.assign_private_dns_record \
         create_vnic_details.assign_public_ip create_vnic_details.defined_tags \
         create_vnic_details.display_name create_vnic_details.freeform_tags \
         create_vnic_details.hostname_label create_vnic_details.nsg_ids \
         create_vnic_details.private_ip create_vnic_details.skip_source_dest_check \
         create_vnic_details.subnet_id create_vnic_details.vlan_id source_details \
         source_details.source_id source_details.source_type \
         source_details.boot_volume_size_in_gbs source_details.boot_volume_vpus_per_gb \
         source_details.kms_key_id shape_config shape_config.baseline_ocpu_utilization \
         shape_config.memory_in_gbs shape_config.nvmes shape_config.ocpus \
         shape_config.vcpus launch_options launch_options.boot_volume_type \
         launch_options.firmware launch_options.is_consistent_volume_naming_enabled \
         launch_options.is_pv_encryption_in_transit_enabled launch_options.network_type \
         launch_options.remote_data_volume_type agent_config \
         agent_config.are_all_plugins_disabled agent_config.is_management_disabled \
         agent_config.is_monitoring_disabled instance_options \
         instance_options.are_legacy_imds_endpoints_disabled",
    ),
    (
        "resource",
        "oci_load_balancer_load_balancer",
        "compartment_id defined_tags display_name freeform_tags ip_mode \
         is_delete_protection_enabled is_private is_request_id_enabled \
         network_security_group_ids request_id_header reserved_ips reserved_ips.id shape \
         shape_details shape_details.maximum_bandwidth_in_mbps \
         shape_details.minimum_bandwidth_in_mbps subnet_ids",
    ),
    (
        "resource",
        "oci_load_balancer_backend_set",
        "load_balancer_id name policy health_checker health_checker.interval_ms \
         health_checker.port health_checker.protocol health_checker.response_body_regex \
         health_checker.retries health_checker.return_code \
         health_checker.timeout_in_millis health_checker.url_path \
         health_checker.is_force_plain_text ssl_configuration ssl_configuration.certificate_ids \
         ssl_configuration.certificate_name ssl_configuration.cipher_suite_name \
         ssl_configuration.protocols ssl_configuration.server_order_preference \
         ssl_configuration.trusted_certificate_authority_ids ssl_configuration.verify_depth \
         ssl_configuration.verify_peer_certificate",
    ),
    (
        "resource",
        "oci_load_balancer_backend",
        "backendset_name backup drain ip_address load_balancer_id offline port weight",
    ),
    (
        "resource",
        "oci_load_balancer_certificate",
        "ca_certificate certificate_name load_balancer_id passphrase private_key \
         public_certificate",
    ),
    (
        "resource",
        "oci_load_balancer_listener",
        "default_backend_set_name hostname_names load_balancer_id name \
         path_route_set_name port protocol rule_set_names connection_configuration \
         connection_configuration.idle_timeout_in_seconds \
         connection_configuration.backend_tcp_proxy_protocol_version ssl_configuration \
         ssl_configuration.certificate_name ssl_configuration.verify_depth \
         ssl_configuration.verify_peer_certificate ssl_configuration.protocols \
         ssl_configuration.cipher_suite_name ssl_configuration.server_order_preference",
    ),
    ("data", "oci_objectstorage_namespace", "compartment_id"),
    (
        "data",
        "oci_identity_availability_domains",
        "compartment_id",
    ),
    (
        "data",
        "oci_core_compute_global_image_capability_schemas",
        "compartment_id display_name",
    ),
];

/// Terraform's own meta-arguments and blocks, valid in every resource; `timeouts` is the
/// provider's, documented on each resource's page.
const META: &[&str] = &[
    "count",
    "for_each",
    "depends_on",
    "provider",
    "lifecycle",
    "timeouts",
];

/// Every .tf file of deploy/oci/ as python-hcl2 parses it, merged: {block kind: [blocks]}.
fn parse() -> BTreeMap<String, Vec<Value>> {
    let dir = test_support::workspace_root().join("deploy/oci");
    let script = r#"
import glob, json, sys
try:
    import hcl2
except ImportError:
    sys.exit("python-hcl2 is not installed: `cargo xtask test` installs "
             "xtask/python-requirements.txt, or `pip install -r xtask/python-requirements.txt`")
out = {}
for path in sorted(glob.glob(sys.argv[1] + "/*.tf")):
    with open(path) as f:
        for kind, blocks in hcl2.load(f).items():
            if not kind.startswith("__"):
                out.setdefault(kind, []).extend(blocks)
print(json.dumps(out))
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&dir)
        .output()
        .expect("python3 parses the HCL: install it (apt-get install python3)");
    assert!(
        out.status.success(),
        "parsing {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A label or string value without HCL's quotes.
fn unquote(v: &str) -> &str {
    v.strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(v)
}

/// The (type, name, body) of every block of `kind` ("resource" or "data").
fn blocks<'a>(
    parsed: &'a BTreeMap<String, Vec<Value>>,
    kind: &str,
) -> Vec<(&'a str, &'a str, &'a Value)> {
    let mut all = Vec::new();
    for block in parsed.get(kind).into_iter().flatten() {
        for (ty, named) in block.as_object().unwrap() {
            for (name, body) in named.as_object().unwrap() {
                all.push((unquote(ty), unquote(name), body));
            }
        }
    }
    all
}

fn is_block(v: &Value) -> bool {
    v.as_array().is_some_and(|items| {
        !items.is_empty() && items.iter().all(|i| i.get("__is_block__").is_some())
    })
}

/// Every argument and nested block name in `body`, dotted from `prefix`; a `dynamic "X"` block
/// counts as block X with its `content`.
fn names(body: &Value, prefix: &str, out: &mut Vec<String>) {
    for (key, value) in body.as_object().unwrap() {
        if key.starts_with("__") {
            continue;
        }
        if key == "dynamic" {
            for dynamic in value.as_array().unwrap() {
                for (label, spec) in dynamic.as_object().unwrap() {
                    let path = format!("{prefix}{}", unquote(label));
                    out.push(path.clone());
                    for content in spec["content"].as_array().unwrap() {
                        names(content, &format!("{path}."), out);
                    }
                }
            }
            continue;
        }
        let path = format!("{prefix}{key}");
        out.push(path.clone());
        // Meta blocks (lifecycle, timeouts) are Terraform's or the provider's own.
        if is_block(value) && !(prefix.is_empty() && META.contains(&key.as_str())) {
            for item in value.as_array().unwrap() {
                names(item, &format!("{path}."), out);
            }
        }
    }
}

#[test]
fn every_resource_and_argument_is_one_the_oci_provider_documents() {
    let parsed = parse();
    let mut unknown = Vec::new();
    let mut seen = 0;
    for kind in ["resource", "data"] {
        for (ty, name, body) in blocks(&parsed, kind) {
            seen += 1;
            let Some((_, _, allowed)) = SCHEMAS.iter().find(|s| s.0 == kind && s.1 == ty) else {
                unknown.push(format!("{kind} type {ty} ({name})"));
                continue;
            };
            let mut found = Vec::new();
            names(body, "", &mut found);
            for arg in found {
                if !allowed.split_whitespace().any(|a| a == arg) && !META.contains(&arg.as_str()) {
                    unknown.push(format!("{kind} {ty}.{name}: argument {arg}"));
                }
            }
        }
    }
    assert!(seen >= 17, "only {seen} resources and data sources parsed");
    assert!(
        unknown.is_empty(),
        "not in the oracle/oci provider's documentation:\n{}",
        unknown.join("\n")
    );
    // The provider is the official one.
    let terraform = &parsed["terraform"][0]["required_providers"][0]["oci"];
    assert_eq!(unquote(terraform["source"].as_str().unwrap()), "oracle/oci");
}

/// The single block `ty`.`name` of `kind`.
fn one<'a>(parsed: &'a BTreeMap<String, Vec<Value>>, ty: &str, name: &str) -> &'a Value {
    blocks(parsed, "resource")
        .into_iter()
        .find(|(t, n, _)| *t == ty && *n == name)
        .unwrap_or_else(|| panic!("no resource {ty}.{name} in deploy/oci"))
        .2
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    unquote(v[key].as_str().unwrap_or_else(|| panic!("{key} in {v}")))
}

#[test]
fn the_deployment_is_always_free_and_checks_health_on_the_profiles_port() {
    let parsed = parse();
    let lb = one(&parsed, "oci_load_balancer_load_balancer", "appliance");
    assert_eq!(str_at(lb, "shape"), "flexible");
    let shape = &lb["shape_details"][0];
    assert_eq!(shape["minimum_bandwidth_in_mbps"], 10);
    assert_eq!(shape["maximum_bandwidth_in_mbps"], 10);

    let health = &one(&parsed, "oci_load_balancer_backend_set", "boxes")["health_checker"][0];
    assert_eq!(str_at(health, "protocol"), "HTTP");
    assert_eq!(str_at(health, "url_path"), "/health");
    assert_eq!(str_at(health, "port"), "${var.api_port}");
    // The appliance serves only HTTPS: the balancer and its health check must speak TLS to it.
    let backends = one(&parsed, "oci_load_balancer_backend_set", "boxes");
    assert_eq!(health["is_force_plain_text"], false);
    assert!(backends["ssl_configuration"][0]["certificate_name"].is_string());

    // TLS terminates at the listener.
    let listener = one(&parsed, "oci_load_balancer_listener", "https");
    assert_eq!(listener["port"], 443);
    assert!(listener["ssl_configuration"][0]["certificate_name"].is_string());

    let image = one(&parsed, "oci_core_image", "appliance");
    assert_eq!(str_at(image, "launch_mode"), "PARAVIRTUALIZED");
    assert_eq!(
        str_at(&image["image_source_details"][0], "source_image_type"),
        "QCOW2"
    );
    let schema = one(&parsed, "oci_core_compute_image_capability_schema", "uefi");
    let firmware = schema["schema_data"]["\"Compute.Firmware\""]
        .as_str()
        .unwrap();
    assert!(firmware.contains("UEFI_64"), "{firmware}");

    let instance = one(&parsed, "oci_core_instance", "box");
    assert_eq!(str_at(instance, "count"), "${var.instance_count}");
    let metadata = instance["metadata"].as_object().unwrap();
    assert!(metadata.contains_key("ssh_authorized_keys"), "{metadata:?}");
    assert!(metadata.contains_key("llm_api_keys"), "{metadata:?}");
    let locals = &parsed["locals"][0];
    assert_eq!(str_at(locals, "shape"), "VM.Standard.E2.1.Micro");
}

#[test]
fn the_variables_defaults_are_the_profiles_ports_and_ipv4_cidrs() {
    let parsed = parse();
    let mut defaults = BTreeMap::new();
    for block in &parsed["variable"] {
        for (name, body) in block.as_object().unwrap() {
            if let Some(default) = body.get("default") {
                defaults.insert(unquote(name).to_owned(), default.clone());
            }
        }
    }
    assert_eq!(defaults["instance_count"], 2, "Always Free: two E2.1.Micro");
    let profile = appliance::Profile::load(&test_support::default_profile()).unwrap();
    assert_eq!(defaults["api_port"], profile.server.api_port.0);
    assert_eq!(defaults["ssh_port"], profile.network.ssh_port.0);
    let ipv4 = |cidrs: &[appliance::cidr::Cidr]| -> Vec<String> {
        cidrs
            .iter()
            .map(ToString::to_string)
            .filter(|c| !c.contains(':'))
            .collect()
    };
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| unquote(s.as_str().unwrap()).to_owned())
            .collect()
    };
    assert_eq!(
        strings(&defaults["ssh_cidrs"]),
        ipv4(&profile.network.ssh_cidrs)
    );
    assert_eq!(
        strings(&defaults["api_cidrs"]),
        ipv4(&profile.network.api_cidrs)
    );
}
