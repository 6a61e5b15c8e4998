from recipes.sweep.cli import main

main()
