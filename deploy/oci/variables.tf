variable "region" {
  description = "OCI region, e.g. eu-frankfurt-1: the tenancy's home region, where Always-Free compute lives."
  type        = string
}

variable "oci_profile" {
  description = "The profile in ~/.oci/config to authenticate with."
  type        = string
  default     = "DEFAULT"
}

variable "tenancy_ocid" {
  description = "The tenancy's OCID (availability domains are listed from the root compartment)."
  type        = string
}

variable "compartment_ocid" {
  description = "The compartment to create everything in."
  type        = string
}

variable "bucket" {
  description = "The Object Storage bucket holding the uploaded qcow2."
  type        = string
}

variable "image_object" {
  description = "The qcow2's object name in the bucket (`cargo xtask oci-upload --keep-object` names it <name>.qcow2)."
  type        = string
  default     = "e2-micro.qcow2"
}

variable "instance_count" {
  description = "How many boxes: the Always-Free tier allows two E2.1.Micro instances per tenancy."
  type        = number
  default     = 2
  validation {
    condition     = var.instance_count >= 1
    error_message = "instance_count must be at least 1."
  }
}

variable "availability_domain_number" {
  description = "Which availability domain (1, 2 or 3) to launch in: E2.1.Micro is offered in one AD of the home region; the console's shape list shows which."
  type        = number
  default     = 1
}

variable "ssh_public_key_file" {
  description = "The SSH public key the boxes install for root (from the instance metadata, at boot)."
  type        = string
  default     = "~/.ssh/id_ed25519.pub"
}

variable "api_keys" {
  description = "The API keys the servers accept (Authorization: Bearer KEY), one per entry; they reach each box as the user metadata key llm_api_keys, one key a line, the format of llm-server's --api-key-file."
  type        = list(string)
  sensitive   = true
}

variable "tls_certificate_file" {
  description = "PEM certificate (with its chain) the load balancer presents on port 443."
  type        = string
}

variable "tls_private_key_file" {
  description = "PEM private key of tls_certificate_file."
  type        = string
}

# The next three must match appliance/profiles/e2-micro.toml ([server] api_port, [network]
# ssh_port, ssh_cidrs and api_cidrs; a test holds the defaults to it). The VCN here is IPv4-only,
# so the profile's ::/0 has no rule. The boxes' own nftables admit the API port from the
# profile's api_cidrs: those must contain lb_subnet_cidr, or the health check fails.
variable "api_port" {
  description = "The port llm-server listens on, on each box."
  type        = number
  default     = 8080
}

variable "ssh_port" {
  description = "The boxes' SSH port."
  type        = number
  default     = 22
}

variable "ssh_cidrs" {
  description = "Who may SSH to the boxes."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

variable "api_cidrs" {
  description = "Who may reach the API through the load balancer (port 443)."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

variable "vcn_cidr" {
  type    = string
  default = "10.0.0.0/16"
}

variable "lb_subnet_cidr" {
  type    = string
  default = "10.0.1.0/24"
}

variable "box_subnet_cidr" {
  type    = string
  default = "10.0.2.0/24"
}
