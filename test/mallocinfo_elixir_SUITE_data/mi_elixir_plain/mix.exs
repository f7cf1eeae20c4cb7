# An Elixir application that does not depend on mallocinfo: its release is
# where mallocinfo_elixir_SUITE injects the tarball from the remote console.
defmodule MiElixirPlain.MixProject do
  use Mix.Project

  def project do
    [app: :mi_elixir_plain, version: "0.1.0", elixir: "~> 1.14", deps: []]
  end

  def application, do: []
end
