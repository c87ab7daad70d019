# Two llm-appliance boxes behind one OCI flexible load balancer, all inside the Always-Free
# tier: two VM.Standard.E2.1.Micro instances and one 10 Mbps flexible load balancer.
# OpenTofu or Terraform with the official oracle/oci provider; see README.md, "Oracle Cloud".

terraform {
  required_version = ">= 1.5"
  required_providers {
    oci = {
      source  = "oracle/oci"
      version = ">= 6.0"
    }
  }
}

# Authentication comes from the OCI CLI's configuration (~/.oci/config, `oci setup config`),
# the same one `cargo xtask oci-upload` uses.
provider "oci" {
  region              = var.region
  config_file_profile = var.oci_profile
}
