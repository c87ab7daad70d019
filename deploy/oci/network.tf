# One VCN, two public subnets: the load balancer's, and the boxes' (public so that SSH reaches
# them; the API port admits only the load balancer's subnet).

resource "oci_core_vcn" "appliance" {
  compartment_id = var.compartment_ocid
  cidr_blocks    = [var.vcn_cidr]
  display_name   = "llm-appliance"
  dns_label      = "llmappliance"
}

resource "oci_core_internet_gateway" "appliance" {
  compartment_id = var.compartment_ocid
  vcn_id         = oci_core_vcn.appliance.id
  display_name   = "llm-appliance"
  enabled        = true
}

resource "oci_core_route_table" "appliance" {
  compartment_id = var.compartment_ocid
  vcn_id         = oci_core_vcn.appliance.id
  display_name   = "llm-appliance"
  route_rules {
    network_entity_id = oci_core_internet_gateway.appliance.id
    destination       = "0.0.0.0/0"
    destination_type  = "CIDR_BLOCK"
  }
}

# The load balancer: HTTPS from api_cidrs in; out to the boxes' API port.
resource "oci_core_security_list" "lb" {
  compartment_id = var.compartment_ocid
  vcn_id         = oci_core_vcn.appliance.id
  display_name   = "llm-appliance-lb"

  dynamic "ingress_security_rules" {
    for_each = var.api_cidrs
    content {
      protocol    = "6"
      source      = ingress_security_rules.value
      description = "HTTPS to the load balancer"
      tcp_options {
        min = 443
        max = 443
      }
    }
  }

  egress_security_rules {
    protocol    = "6"
    destination = var.box_subnet_cidr
    description = "the boxes' API port, for requests and the health check"
    tcp_options {
      min = var.api_port
      max = var.api_port
    }
  }
}

# The boxes: SSH from ssh_cidrs, the API port from the load balancer's subnet only. Egress is
# open here: the boxes' nftables already limit it to OCI's metadata service, DNS and NTP.
resource "oci_core_security_list" "boxes" {
  compartment_id = var.compartment_ocid
  vcn_id         = oci_core_vcn.appliance.id
  display_name   = "llm-appliance-boxes"

  dynamic "ingress_security_rules" {
    for_each = var.ssh_cidrs
    content {
      protocol    = "6"
      source      = ingress_security_rules.value
      description = "SSH"
      tcp_options {
        min = var.ssh_port
        max = var.ssh_port
      }
    }
  }

  ingress_security_rules {
    protocol    = "6"
    source      = var.lb_subnet_cidr
    description = "the API port, from the load balancer only"
    tcp_options {
      min = var.api_port
      max = var.api_port
    }
  }

  # Path MTU discovery (ICMP type 3, code 4), as OCI's default security list allows.
  ingress_security_rules {
    protocol = "1"
    source   = "0.0.0.0/0"
    icmp_options {
      type = 3
      code = 4
    }
  }

  egress_security_rules {
    protocol    = "all"
    destination = "0.0.0.0/0"
  }
}

resource "oci_core_subnet" "lb" {
  compartment_id    = var.compartment_ocid
  vcn_id            = oci_core_vcn.appliance.id
  cidr_block        = var.lb_subnet_cidr
  display_name      = "llm-appliance-lb"
  dns_label         = "lb"
  route_table_id    = oci_core_route_table.appliance.id
  security_list_ids = [oci_core_security_list.lb.id]
}

resource "oci_core_subnet" "boxes" {
  compartment_id    = var.compartment_ocid
  vcn_id            = oci_core_vcn.appliance.id
  cidr_block        = var.box_subnet_cidr
  display_name      = "llm-appliance-boxes"
  dns_label         = "boxes"
  route_table_id    = oci_core_route_table.appliance.id
  security_list_ids = [oci_core_security_list.boxes.id]
}
